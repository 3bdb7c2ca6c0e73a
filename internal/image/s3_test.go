package image

import (
	"context"
	"crypto/x509"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/testutil"
)

// newS3Store starts gofakes3 over TLS on loopback (it mishandles
// multipart uploads over plain HTTP) and returns a blob store on it.
func newS3Store(t *testing.T) *blob.S3Store {
	t.Helper()
	srv := httptest.NewUnstartedServer(gofakes3.New(s3mem.New()).Server())
	srv.StartTLS()
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	s, err := blob.NewS3Store(context.Background(), blob.S3Config{
		Endpoint: srv.Listener.Addr().String(), Secure: true, Region: "us-east-1",
		Bucket: "images", Prefix: "dsec/", AccessKey: "k", SecretKey: "s",
		RootCAs: pool, PathStyle: true, CreateBucket: true, MaxRetries: 2,
	})
	must(t, err)
	return s
}

// TestImageOnS3 runs an import, unpack, snapshot-style layer and GC with
// the S3 backend.
func TestImageOnS3(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx := context.Background()
	bs := newS3Store(t)
	meta, err := NewDirMeta(t.TempDir())
	must(t, err)
	s, err := NewStore(bs, meta, WithTempDir(t.TempDir()))
	must(t, err)

	src := filepath.Join(t.TempDir(), "src")
	makeTree(t, src, false)
	im, err := s.Import(ctx, "s3img:1", src)
	must(t, err)
	out := filepath.Join(t.TempDir(), "out")
	must(t, Unpack(ctx, bs, im.Manifest.Layers[0].Digest, out))
	compareTrees(t, src, out)

	oci, err := s.Import(ctx, "s3img:oci", writeLayout(t, testImage(t)))
	must(t, err)
	checkOCISemantics(t, s, oci)
	must(t, s.Remove(ctx, "s3img:oci"))
	res, err := s.GC(ctx, nil, WithGracePeriod(0))
	must(t, err)
	if res.RemovedBlobs == 0 {
		t.Fatalf("GC on S3 removed nothing")
	}
	readAllChunks(t, s, "s3img:1")
}
