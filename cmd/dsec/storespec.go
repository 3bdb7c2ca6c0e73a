package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/dsec-dev/dsec/internal/blob"
)

// openBlobStore opens the blob store named by spec:
//
//	dir:/path                 a directory (local disk, or a shared mount: 3FS, CephFS, NFS)
//	s3://host:port/bucket/prefix?secure=true&region=r&create=true
//
// S3 credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
// (never from the command line, where other users could read them).
func openBlobStore(ctx context.Context, spec, dataDir string) (blob.Store, error) {
	switch {
	case spec == "":
		return blob.NewDirStore(filepath.Join(dataDir, "blobs"))
	case strings.HasPrefix(spec, "dir:"):
		return blob.NewDirStore(strings.TrimPrefix(spec, "dir:"))
	case strings.HasPrefix(spec, "s3://"):
		u, err := url.Parse(spec)
		if err != nil {
			return nil, fmt.Errorf("--store %q: %v", spec, err)
		}
		bucket, prefix, _ := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
		if u.Host == "" || bucket == "" {
			return nil, fmt.Errorf("--store %q: want s3://HOST[:PORT]/BUCKET[/PREFIX]", spec)
		}
		if prefix != "" && !strings.HasSuffix(prefix, "/") {
			prefix += "/"
		}
		q := u.Query()
		return blob.NewS3Store(ctx, blob.S3Config{
			Endpoint:     u.Host,
			Secure:       q.Get("secure") != "false",
			Region:       q.Get("region"),
			Bucket:       bucket,
			Prefix:       prefix,
			AccessKey:    os.Getenv("AWS_ACCESS_KEY_ID"),
			SecretKey:    os.Getenv("AWS_SECRET_ACCESS_KEY"),
			SessionToken: os.Getenv("AWS_SESSION_TOKEN"),
			PathStyle:    true,
			CreateBucket: q.Get("create") == "true",
		})
	default:
		return nil, fmt.Errorf("--store %q: want dir:/path or s3://host/bucket", spec)
	}
}
