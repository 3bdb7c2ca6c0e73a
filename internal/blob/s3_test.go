package blob_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/blob/blobtest"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// newFakeS3 starts an in-process S3 server (gofakes3) over TLS on loopback
// and returns a config whose client trusts only that server's certificate.
// TLS matters: gofakes3 mishandles multipart uploads over plain HTTP.
func newFakeS3(t *testing.T) blob.S3Config {
	t.Helper()
	faker := gofakes3.New(s3mem.New(), gofakes3.WithAutoBucket(false))
	srv := httptest.NewUnstartedServer(faker.Server())
	srv.StartTLS()
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	return blob.S3Config{
		Endpoint:     srv.Listener.Addr().String(),
		Secure:       true,
		Region:       "us-east-1",
		AccessKey:    "dsec",
		SecretKey:    "dsec-secret",
		RootCAs:      pool,
		PathStyle:    true,
		MaxRetries:   2,
		CreateBucket: true,
	}
}

var bucketSeq atomic.Int64

func TestS3StoreConformance(t *testing.T) {
	blobtest.Suite(t, func(t *testing.T) blob.Store {
		cfg := newFakeS3(t)
		cfg.Bucket = fmt.Sprintf("dsec-%d", bucketSeq.Add(1))
		cfg.Prefix = "blobs/"
		cfg.PartSize = 5 << 20 // the 9 MiB conformance blob goes multipart
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s, err := blob.NewS3Store(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestS3StoreMissingBucket(t *testing.T) {
	cfg := newFakeS3(t)
	cfg.Bucket = "absent"
	cfg.CreateBucket = false
	if _, err := blob.NewS3Store(context.Background(), cfg); !errdefs.IsNotFound(err) {
		t.Fatalf("missing bucket: %v, want not found", err)
	}
}

func TestS3StoreUntrustedCert(t *testing.T) {
	cfg := newFakeS3(t)
	cfg.Bucket = "b"
	cfg.RootCAs = x509.NewCertPool() // trusts nothing
	cfg.MaxRetries = 1
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := blob.NewS3Store(ctx, cfg); !errdefs.IsUnavailable(err) {
		t.Fatalf("untrusted server cert: %v, want unavailable", err)
	}
}
