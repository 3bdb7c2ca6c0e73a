// Package blob is dsec's content-addressed store for layer indexes and data
// chunks. Backends: a directory (local disk or a shared mount such as 3FS,
// CephFS or NFS) and S3. Every blob is named by the sha256 digest of its
// bytes and verified on read by the layer above.
package blob

import (
	"context"
	"io"
)

// Digest is "sha256:<hex>".
type Digest string

// Info describes a stored blob.
type Info struct {
	Digest Digest
	Size   int64
}

// Reader reads blobs. ReadAt fills p from offset off and returns the bytes
// read; reading past the end returns io.EOF like io.ReaderAt.
type Reader interface {
	ReadAt(ctx context.Context, d Digest, p []byte, off int64) (int, error)
	Stat(ctx context.Context, d Digest) (Info, error)
}

// Writer stores blobs. Put reads r to the end, stores it under its digest
// and returns it; if expected is non-empty and differs, nothing is stored
// and an error wrapping errdefs.ErrInvalidArgument is returned. Putting an
// existing blob is cheap and not an error.
type Writer interface {
	Put(ctx context.Context, expected Digest, r io.Reader) (Info, error)
}

// Store is the full blob store.
type Store interface {
	Reader
	Writer
	Delete(ctx context.Context, d Digest) error
	Walk(ctx context.Context, fn func(Info) error) error
}
