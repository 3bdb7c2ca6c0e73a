package image

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// IndexVersion is the layer index format version.
const IndexVersion = 1

// Entry types.
const (
	TypeReg      = "reg"
	TypeDir      = "dir"
	TypeSymlink  = "symlink"
	TypeHardlink = "hardlink" // Linkname is the path of the target inside the layer
	TypeChar     = "char"     // a 0/0 char device is an overlay whiteout
	TypeBlock    = "block"
	TypeFifo     = "fifo"
)

// Overlay xattrs kept in the index.
const (
	XattrOpaque = "trusted.overlay.opaque"
)

// Chunk is one piece of a regular file's content. The blob named Digest
// holds the raw bytes, unless Stored is set: then the blob named Stored
// holds one zstd frame of them. Readers verify sha256(raw) == Digest
// (ReadChunk does). File ranges covered by no chunk read as zeros.
type Chunk struct {
	Digest blob.Digest `json:"d"`           // sha256 of the uncompressed bytes
	Offset int64       `json:"o"`           // offset in the file
	Size   int64       `json:"s"`           // uncompressed size
	Stored blob.Digest `json:"z,omitempty"` // blob holding the zstd form, if compressed
	// StoredSize is the size of the Stored blob (compressed chunks only).
	StoredSize int64 `json:"zs,omitempty"`
}

// BlobSize returns the size of the blob that holds the chunk.
func (c Chunk) BlobSize() int64 {
	if c.Stored != "" {
		return c.StoredSize
	}
	return c.Size
}

// Blob returns the digest of the blob that holds the chunk.
func (c Chunk) Blob() blob.Digest {
	if c.Stored != "" {
		return c.Stored
	}
	return c.Digest
}

// Entry is one path in a layer.
type Entry struct {
	Path     string            `json:"p"` // clean, relative, no leading slash; "" is the root dir
	Type     string            `json:"t"`
	Mode     os.FileMode       `json:"m"` // permission and setuid/setgid/sticky bits
	UID      int               `json:"u"`
	GID      int               `json:"g"`
	Size     int64             `json:"s,omitempty"`
	ModTime  time.Time         `json:"mt"`
	Linkname string            `json:"l,omitempty"`
	Devmajor int64             `json:"dM,omitempty"`
	Devminor int64             `json:"dm,omitempty"`
	Xattrs   map[string][]byte `json:"x,omitempty"`
	Chunks   []Chunk           `json:"c,omitempty"`
}

// IsWhiteout reports an overlay whiteout (0/0 character device).
func (e *Entry) IsWhiteout() bool {
	return e.Type == TypeChar && e.Devmajor == 0 && e.Devminor == 0
}

// IsOpaque reports an overlay opaque directory.
func (e *Entry) IsOpaque() bool {
	return e.Type == TypeDir && string(e.Xattrs[XattrOpaque]) == "y"
}

// UnixMode returns st_mode: the file type bits plus permission, setuid,
// setgid and sticky bits. A hardlink carries no file type of its own:
// resolve it to its target (Linkname) first.
func (e *Entry) UnixMode() uint32 {
	m := uint32(e.Mode.Perm())
	if e.Mode&os.ModeSetuid != 0 {
		m |= syscall.S_ISUID
	}
	if e.Mode&os.ModeSetgid != 0 {
		m |= syscall.S_ISGID
	}
	if e.Mode&os.ModeSticky != 0 {
		m |= syscall.S_ISVTX
	}
	switch e.Type {
	case TypeReg:
		m |= syscall.S_IFREG
	case TypeDir:
		m |= syscall.S_IFDIR
	case TypeSymlink:
		m |= syscall.S_IFLNK
	case TypeChar:
		m |= syscall.S_IFCHR
	case TypeBlock:
		m |= syscall.S_IFBLK
	case TypeFifo:
		m |= syscall.S_IFIFO
	}
	return m
}

// Index is a layer's metadata; its blob digest is the layer's identity.
type Index struct {
	Version int     `json:"version"`
	Entries []Entry `json:"entries"` // sorted by ComparePaths; parents before children
	// Size is the sum of regular file sizes.
	Size int64 `json:"size"`
	// ChunkSize is the chunking granularity used to build the layer
	// (informational: readers use each chunk's Offset and Size).
	ChunkSize int64 `json:"chunk_size,omitempty"`
}

// ComparePaths orders index paths byte-wise with '/' before every other
// byte, so parents precede children and every subtree is contiguous.
func ComparePaths(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		ca, cb := a[i], b[i]
		if ca == cb {
			continue
		}
		if ca == '/' {
			return -1
		}
		if cb == '/' {
			return 1
		}
		if ca < cb {
			return -1
		}
		return 1
	}
	return len(a) - len(b)
}

// Lookup finds an entry by path (binary search).
func (ix *Index) Lookup(p string) (*Entry, bool) {
	i, ok := slices.BinarySearchFunc(ix.Entries, p, func(e Entry, p string) int { return ComparePaths(e.Path, p) })
	if !ok {
		return nil, false
	}
	return &ix.Entries[i], true
}

// Validate checks the invariants readers rely on: sorted clean unique
// paths, a root, parents that are directories, hardlinks to earlier
// non-directory entries, chunks inside their file in order. It guards
// consumers (lazyfs, Unpack) against a malformed index.
func (ix *Index) Validate() error {
	bad := func(p, why string) error {
		return fmt.Errorf("layer index: entry %q: %s: %w", p, why, errdefs.ErrInvalidArgument)
	}
	if ix.Version != IndexVersion {
		return fmt.Errorf("layer index: version %d, want %d: %w", ix.Version, IndexVersion, errdefs.ErrInvalidArgument)
	}
	if len(ix.Entries) == 0 || ix.Entries[0].Path != "" || ix.Entries[0].Type != TypeDir {
		return fmt.Errorf("layer index: no root directory entry: %w", errdefs.ErrInvalidArgument)
	}
	var size int64
	for i := range ix.Entries {
		e := &ix.Entries[i]
		if i > 0 {
			if ComparePaths(ix.Entries[i-1].Path, e.Path) >= 0 {
				return bad(e.Path, "out of order or duplicate")
			}
			if e.Path != path.Clean(e.Path) || strings.HasPrefix(e.Path, "/") || e.Path == "." || e.Path == ".." || strings.HasPrefix(e.Path, "../") {
				return bad(e.Path, "not a clean relative path")
			}
			parent, _ := path.Split(e.Path)
			parent = strings.TrimSuffix(parent, "/")
			pe, ok := ix.Lookup(parent)
			if !ok || pe.Type != TypeDir {
				return bad(e.Path, "parent is not a directory in the layer")
			}
		}
		switch e.Type {
		case TypeReg:
			var end int64
			for _, c := range e.Chunks {
				if c.Offset < end || c.Size <= 0 || c.Offset+c.Size > e.Size {
					return bad(e.Path, "chunk list out of order or outside the file")
				}
				if c.Digest.Validate() != nil || (c.Stored != "" && c.Stored.Validate() != nil) {
					return bad(e.Path, "malformed chunk digest")
				}
				end = c.Offset + c.Size
			}
			size += e.Size
		case TypeHardlink:
			t, ok := ix.Lookup(e.Linkname)
			if !ok || t.Type == TypeDir || t.Type == TypeHardlink || ComparePaths(t.Path, e.Path) >= 0 {
				return bad(e.Path, "hardlink target "+e.Linkname+" is not an earlier non-directory entry")
			}
		case TypeDir, TypeSymlink, TypeChar, TypeBlock, TypeFifo:
		default:
			return bad(e.Path, "unknown type "+e.Type)
		}
	}
	if size != ix.Size {
		return fmt.Errorf("layer index: size %d, entries sum to %d: %w", ix.Size, size, errdefs.ErrInvalidArgument)
	}
	return nil
}

// encodeIndex returns the index blob: one zstd frame of the JSON.
func encodeIndex(ix *Index) ([]byte, error) {
	js, err := json.Marshal(ix)
	if err != nil {
		return nil, fmt.Errorf("encode layer index: %w", err)
	}
	return zenc.EncodeAll(js, nil), nil
}

// ReadIndex reads, verifies (digest and invariants) and decodes a layer
// index.
func ReadIndex(ctx context.Context, r blob.Reader, layer blob.Digest) (*Index, error) {
	raw, err := blob.ReadAll(ctx, r, layer)
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", layer, err)
	}
	js, err := zdec.DecodeAll(raw, nil)
	if err != nil {
		return nil, fmt.Errorf("layer %s: not a layer index: %w: %w", layer, errdefs.ErrInvalidArgument, err)
	}
	var ix Index
	if err := json.Unmarshal(js, &ix); err != nil {
		return nil, fmt.Errorf("layer %s: not a layer index: %w: %w", layer, errdefs.ErrInvalidArgument, err)
	}
	if err := ix.Validate(); err != nil {
		return nil, fmt.Errorf("layer %s: %w", layer, err)
	}
	return &ix, nil
}
