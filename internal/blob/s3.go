package blob

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// S3Config locates a bucket. Blobs are objects <Prefix>sha256/<hex>.
type S3Config struct {
	Endpoint     string // host[:port], no scheme
	Secure       bool   // HTTPS
	Region       string
	Bucket       string
	Prefix       string // e.g. "dsec/"; "" = bucket root
	AccessKey    string
	SecretKey    string
	SessionToken string
	// RootCAs are the CAs trusted for Endpoint; nil = the system pool.
	RootCAs *x509.CertPool
	// Transport, if set, is used as is (RootCAs is then ignored).
	Transport http.RoundTripper
	// PathStyle forces bucket-in-path URLs (most self-hosted servers).
	PathStyle bool
	// MaxRetries bounds retries of one request; 0 = 3.
	MaxRetries int
	// PartSize is the multipart threshold and part size (>= 5 MiB);
	// 0 = 64 MiB, so chunks and most indexes go in one PUT.
	PartSize uint64
	// CreateBucket makes the bucket when it does not exist.
	CreateBucket bool
	// RefreshAge: a Put of an existing object older than this re-uploads
	// it to refresh its LastModified (S3 has no touch), so a GC whose grace
	// period exceeds RefreshAge plus the writer's run never drops a blob a
	// writer reused. 0 = 10 min.
	RefreshAge time.Duration
}

// S3Store is a blob store in an S3 bucket (minio-go). PUTs are atomic in
// S3, so objects are written in place after the content is verified.
type S3Store struct {
	c          *minio.Client
	bucket     string
	prefix     string
	refreshAge time.Duration
	partSize   uint64
}

var _ Store = (*S3Store)(nil)

// memSpool is how much of a Put is buffered in memory before spilling to
// a temp file (chunks are at most 4 MiB, so they never spill).
const memSpool = 8 << 20

// NewS3Store connects to the bucket and checks that it exists.
func NewS3Store(ctx context.Context, cfg S3Config) (*S3Store, error) {
	if cfg.Endpoint == "" || cfg.Bucket == "" {
		return nil, fmt.Errorf("s3 store: endpoint and bucket are required: %w", errdefs.ErrInvalidArgument)
	}
	tr := cfg.Transport
	if tr == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		if cfg.RootCAs != nil {
			t.TLSClientConfig = &tls.Config{RootCAs: cfg.RootCAs, MinVersion: tls.VersionTLS12}
		}
		tr = t
	}
	retries := cfg.MaxRetries
	if retries <= 0 {
		retries = 3
	}
	lookup := minio.BucketLookupAuto
	if cfg.PathStyle {
		lookup = minio.BucketLookupPath
	}
	c, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:        credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, cfg.SessionToken),
		Secure:       cfg.Secure,
		Transport:    tr,
		Region:       cfg.Region,
		BucketLookup: lookup,
		MaxRetries:   retries,
	})
	if err != nil {
		return nil, fmt.Errorf("s3 store: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	ok, err := c.BucketExists(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("s3 store: bucket %s: %w: %w", cfg.Bucket, errdefs.ErrUnavailable, err)
	}
	if !ok {
		if !cfg.CreateBucket {
			return nil, fmt.Errorf("s3 store: bucket %s: %w", cfg.Bucket, errdefs.ErrNotFound)
		}
		if err := c.MakeBucket(ctx, cfg.Bucket, minio.MakeBucketOptions{Region: cfg.Region}); err != nil {
			return nil, fmt.Errorf("s3 store: make bucket %s: %w", cfg.Bucket, err)
		}
	}
	ra := cfg.RefreshAge
	if ra <= 0 {
		ra = 10 * time.Minute
	}
	ps := cfg.PartSize
	if ps == 0 {
		ps = 64 << 20
	}
	if ps < 5<<20 {
		return nil, fmt.Errorf("s3 store: part size %d below the S3 minimum of 5 MiB: %w", ps, errdefs.ErrInvalidArgument)
	}
	return &S3Store{c: c, bucket: cfg.Bucket, prefix: cfg.Prefix, refreshAge: ra, partSize: ps}, nil
}

func (s *S3Store) key(d Digest) (string, error) {
	if err := d.Validate(); err != nil {
		return "", err
	}
	return s.prefix + "sha256/" + d.Hex(), nil
}

// s3err maps an S3 error response to an errdefs class (S3 error codes are
// protocol values, not Go error strings).
func s3err(d Digest, err error) error {
	switch minio.ToErrorResponse(err).Code {
	case minio.NoSuchKey, "NotFound":
		return fmt.Errorf("blob %s: %w", d, errdefs.ErrNotFound)
	case minio.NoSuchBucket:
		return fmt.Errorf("blob %s: bucket: %w", d, errdefs.ErrNotFound)
	case "AccessDenied":
		return fmt.Errorf("blob %s: %w: %w", d, errdefs.ErrPermissionDenied, err)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("blob %s: %w: %w", d, errdefs.ErrUnavailable, err)
}

// ReadAt implements Reader with one ranged GET.
func (s *S3Store) ReadAt(ctx context.Context, d Digest, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("blob %s: negative offset %d: %w", d, off, errdefs.ErrInvalidArgument)
	}
	k, err := s.key(d)
	if err != nil {
		return 0, err
	}
	if len(p) == 0 {
		if _, err := s.Stat(ctx, d); err != nil {
			return 0, err
		}
		return 0, nil
	}
	opts := minio.GetObjectOptions{}
	if err := opts.SetRange(off, off+int64(len(p))-1); err != nil {
		return 0, fmt.Errorf("blob %s: %w: %w", d, errdefs.ErrInvalidArgument, err)
	}
	obj, err := s.c.GetObject(ctx, s.bucket, k, opts)
	if err != nil {
		return 0, s3err(d, err)
	}
	defer obj.Close()
	n, err := io.ReadFull(obj, p)
	switch {
	case err == nil:
		return n, nil
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return n, io.EOF
	case minio.ToErrorResponse(err).Code == "InvalidRange":
		return 0, io.EOF // off at or past the end
	default:
		return n, s3err(d, err)
	}
}

// Stat implements Reader.
func (s *S3Store) Stat(ctx context.Context, d Digest) (Info, error) {
	k, err := s.key(d)
	if err != nil {
		return Info{}, err
	}
	oi, err := s.c.StatObject(ctx, s.bucket, k, minio.StatObjectOptions{})
	if err != nil {
		return Info{}, s3err(d, err)
	}
	return Info{Digest: d, Size: oi.Size, ModTime: oi.LastModified}, nil
}

// Put implements Writer: the content is spooled (memory, then a temp file)
// and hashed first, so a wrong digest never reaches the bucket, then
// uploaded with its size known.
func (s *S3Store) Put(ctx context.Context, expected Digest, r io.Reader) (Info, error) {
	if expected != "" {
		if err := expected.Validate(); err != nil {
			return Info{}, err
		}
		if info, err := s.Stat(ctx, expected); err == nil && time.Since(info.ModTime) < s.refreshAge {
			return info, nil
		}
	}
	h := sha256.New()
	var mem bytes.Buffer
	n, err := io.CopyN(io.MultiWriter(&mem, h), ctxReader{ctx, r}, memSpool+1)
	if err != nil && err != io.EOF {
		return Info{}, fmt.Errorf("blob put: %w", err)
	}
	var body io.Reader = &mem
	if n > memSpool {
		f, err := os.CreateTemp("", "dsec-s3put-*")
		if err != nil {
			return Info{}, fmt.Errorf("blob put: %w", err)
		}
		defer func() { f.Close(); os.Remove(f.Name()) }()
		if _, err := mem.WriteTo(f); err != nil {
			return Info{}, fmt.Errorf("blob put: %w", err)
		}
		m, err := io.Copy(io.MultiWriter(f, h), ctxReader{ctx, r})
		if err != nil {
			return Info{}, fmt.Errorf("blob put: %w", err)
		}
		n += m
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return Info{}, fmt.Errorf("blob put: %w", err)
		}
		body = f
	}
	d := FromHash(h.Sum(nil))
	if expected != "" && d != expected {
		return Info{}, fmt.Errorf("blob put: content hashes to %s, expected %s: %w", d, expected, ErrDigestMismatch)
	}
	k, _ := s.key(d)
	oi, err := s.c.PutObject(ctx, s.bucket, k, body, n, minio.PutObjectOptions{
		ContentType: "application/octet-stream",
		PartSize:    s.partSize,
	})
	if err != nil {
		return Info{}, s3err(d, err)
	}
	if oi.Size != n {
		return Info{}, fmt.Errorf("blob put %s: stored %d of %d bytes: %w", d, oi.Size, n, errdefs.ErrUnavailable)
	}
	mt := oi.LastModified
	if mt.IsZero() {
		mt = time.Now()
	}
	return Info{Digest: d, Size: n, ModTime: mt}, nil
}

// Delete implements Store. S3 deletes of missing keys succeed, so a Stat
// first keeps ErrNotFound semantics equal to the dir store.
func (s *S3Store) Delete(ctx context.Context, d Digest) error {
	k, err := s.key(d)
	if err != nil {
		return err
	}
	if _, err := s.Stat(ctx, d); err != nil {
		return err
	}
	if err := s.c.RemoveObject(ctx, s.bucket, k, minio.RemoveObjectOptions{}); err != nil {
		return s3err(d, err)
	}
	return nil
}

// Walk implements Store.
func (s *S3Store) Walk(ctx context.Context, fn func(Info) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the lister goroutine on early return
	pfx := s.prefix + "sha256/"
	for oi := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: pfx, Recursive: true}) {
		if oi.Err != nil {
			return fmt.Errorf("blob walk: %w: %w", errdefs.ErrUnavailable, oi.Err)
		}
		d := Digest("sha256:" + strings.TrimPrefix(oi.Key, pfx))
		if d.Validate() != nil {
			continue
		}
		if err := fn(Info{Digest: d, Size: oi.Size, ModTime: oi.LastModified}); err != nil {
			return err
		}
	}
	return ctx.Err()
}
