package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Chunk sizes. Chunks split files at multiples of the chunk size, so a
// file that changes in place shares its unchanged chunks with the old
// version; small files are one chunk.
const (
	MinChunkSize     = 1 << 20
	MaxChunkSize     = 4 << 20
	DefaultChunkSize = 1 << 20
)

// zstd codecs are safe for concurrent EncodeAll/DecodeAll. Output is
// deterministic for a given input and level, which keeps compressed chunk
// blobs deduplicated across imports. The window is the largest chunk: the
// default (8 MiB) made the encoder keep ~37 MB of history buffers in the
// server for good, and gives the same output for inputs up to 4 MiB.
var (
	zenc, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderCRC(false),
		zstd.WithWindowSize(MaxChunkSize))
	// Chunk frames decode to at most MaxChunkSize; the cap stops a
	// corrupt or hostile frame from ballooning memory.
	zchunk, _ = zstd.NewReader(nil, zstd.WithDecoderMaxMemory(2*MaxChunkSize), zstd.WithDecoderConcurrency(0))
	// Indexes of big images are tens of MiB of JSON.
	zdec, _ = zstd.NewReader(nil, zstd.WithDecoderMaxMemory(1<<30), zstd.WithDecoderConcurrency(0))
)

// ReadChunk returns the verified uncompressed bytes of c (exactly c.Size
// bytes) with one blob read. It reuses buf when cap(buf) >= c.Size (and
// needs 2*c.Size to also avoid a scratch allocation for compressed
// chunks). Errors: errdefs.ErrNotFound when the blob is missing,
// blob.ErrDigestMismatch (errdefs.ErrInvalidArgument) when the stored
// bytes are corrupt.
func ReadChunk(ctx context.Context, r blob.Reader, c Chunk, buf []byte) ([]byte, error) {
	if c.Size <= 0 || c.Size > MaxChunkSize {
		return nil, fmt.Errorf("chunk %s: size %d out of range: %w", c.Digest, c.Size, errdefs.ErrInvalidArgument)
	}
	n := int(c.Size)
	var out, scratch []byte
	if cap(buf) >= 2*n {
		out, scratch = buf[:n], buf[n:2*n]
	} else if cap(buf) >= n {
		out = buf[:n]
	} else {
		out = make([]byte, n)
	}
	if c.Stored == "" {
		m, err := r.ReadAt(ctx, c.Digest, out, 0)
		if err != nil && !(err == io.EOF && m == n) {
			if err == io.EOF {
				return nil, fmt.Errorf("chunk %s: blob holds %d of %d bytes: %w", c.Digest, m, n, blob.ErrDigestMismatch)
			}
			return nil, fmt.Errorf("chunk %s: %w", c.Digest, err)
		}
	} else {
		// Compressed chunks are only kept when smaller than the raw
		// bytes, so a buffer of c.Size always holds the whole frame; a
		// full buffer without EOF means the blob is not what we wrote.
		if scratch == nil {
			scratch = make([]byte, n)
		}
		m, err := r.ReadAt(ctx, c.Stored, scratch, 0)
		if err == nil {
			return nil, fmt.Errorf("chunk %s: stored blob %s larger than the chunk: %w", c.Digest, c.Stored, blob.ErrDigestMismatch)
		}
		if err != io.EOF {
			return nil, fmt.Errorf("chunk %s: %w", c.Digest, err)
		}
		dec, err := zchunk.DecodeAll(scratch[:m], out[:0])
		if err != nil || len(dec) != n {
			return nil, fmt.Errorf("chunk %s: stored blob %s does not decompress to %d bytes: %w", c.Digest, c.Stored, n, blob.ErrDigestMismatch)
		}
		out = dec
	}
	sum := sha256.Sum256(out)
	if got := blob.FromHash(sum[:]); got != c.Digest {
		return nil, fmt.Errorf("chunk %s: content hashes to %s: %w", c.Digest, got, blob.ErrDigestMismatch)
	}
	return out, nil
}

// putChunk stores data as a chunk, compressed when that saves at least
// 1/16 of the bytes (incompressible data is not worth a decode per read).
// zbuf is scratch for the compressed form. It returns the chunk (Offset
// unset) and the stored size.
func putChunk(ctx context.Context, w blob.Writer, data, zbuf []byte, compress bool) (Chunk, int64, error) {
	c := Chunk{Digest: blob.FromBytes(data), Size: int64(len(data))}
	if compress {
		z := zenc.EncodeAll(data, zbuf[:0])
		if len(z) < len(data)-len(data)/16 {
			c.Stored, c.StoredSize = blob.FromBytes(z), int64(len(z))
			if _, err := w.Put(ctx, c.Stored, bytes.NewReader(z)); err != nil {
				return Chunk{}, 0, fmt.Errorf("store chunk: %w", err)
			}
			return c, int64(len(z)), nil
		}
	}
	if _, err := w.Put(ctx, c.Digest, bytes.NewReader(data)); err != nil {
		return Chunk{}, 0, fmt.Errorf("store chunk: %w", err)
	}
	return c, int64(len(data)), nil
}

func isZero(b []byte) bool {
	for len(b) >= 8 {
		if b[0]|b[1]|b[2]|b[3]|b[4]|b[5]|b[6]|b[7] != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
