// Package blob is dsec's content-addressed store for layer indexes and data
// chunks. Backends: a directory (local disk or a shared mount such as 3FS,
// CephFS or NFS) and S3. Every blob is named by the sha256 digest of its
// bytes; Put verifies what it stores, and readers that need integrity
// (internal/image) verify what they read, since a shared mount or a bucket
// can be damaged behind our back.
package blob

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Digest is "sha256:<hex>".
type Digest string

// ErrDigestMismatch reports bytes whose sha256 is not the expected one: a
// wrong digest given by a caller or a corrupt blob in the store.
var ErrDigestMismatch = fmt.Errorf("digest mismatch: %w", errdefs.ErrInvalidArgument)

// FromBytes returns the digest of b.
func FromBytes(b []byte) Digest {
	sum := sha256.Sum256(b)
	return Digest("sha256:" + hex.EncodeToString(sum[:]))
}

// FromHash formats a finished sha256 sum.
func FromHash(sum []byte) Digest { return Digest("sha256:" + hex.EncodeToString(sum)) }

// Hex returns the hex part of d.
func (d Digest) Hex() string {
	if len(d) > 7 {
		return string(d[7:])
	}
	return ""
}

// Validate checks that d is a well-formed sha256 digest, so it can be used
// safely as a file or object name.
func (d Digest) Validate() error {
	s := string(d)
	if len(s) != 7+64 || s[:7] != "sha256:" {
		return fmt.Errorf("malformed digest %q: %w", s, errdefs.ErrInvalidArgument)
	}
	for _, c := range s[7:] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return fmt.Errorf("malformed digest %q: %w", s, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// Info describes a stored blob.
type Info struct {
	Digest Digest
	Size   int64
	// ModTime is when the blob was last written or refreshed by a Put of
	// the same content; GC uses it as a grace period against in-flight
	// writers on other nodes.
	ModTime time.Time
}

// Reader reads blobs. ReadAt fills p from offset off and returns the bytes
// read; reading past the end returns io.EOF like io.ReaderAt.
type Reader interface {
	ReadAt(ctx context.Context, d Digest, p []byte, off int64) (int, error)
	Stat(ctx context.Context, d Digest) (Info, error)
}

// Writer stores blobs. Put reads r to the end, stores it under its digest
// and returns it; if expected is non-empty and differs, nothing is stored
// and an error wrapping ErrDigestMismatch (errdefs.ErrInvalidArgument) is
// returned. Putting an existing blob is cheap and not an error: with a
// known expected digest Put may return without reading r, and it refreshes
// the blob's ModTime.
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

// ReadAll reads a whole blob (for small blobs: indexes, manifests, chunks)
// and verifies its digest.
func ReadAll(ctx context.Context, r Reader, d Digest) ([]byte, error) {
	info, err := r.Stat(ctx, d)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, info.Size)
	n, err := r.ReadAt(ctx, d, buf, 0)
	if err != nil && !(err == io.EOF && int64(n) == info.Size) {
		return nil, err
	}
	if int64(n) != info.Size {
		return nil, fmt.Errorf("blob %s: short read %d of %d: %w", d, n, info.Size, ErrDigestMismatch)
	}
	if got := FromBytes(buf); got != d {
		return nil, fmt.Errorf("blob %s: content hashes to %s: %w", d, got, ErrDigestMismatch)
	}
	return buf, nil
}
