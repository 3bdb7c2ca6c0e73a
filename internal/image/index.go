package image

import (
	"os"
	"time"

	"github.com/dsec-dev/dsec/internal/blob"
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

// Chunk is one piece of a regular file's content.
type Chunk struct {
	Digest blob.Digest `json:"d"`           // sha256 of the uncompressed bytes
	Offset int64       `json:"o"`           // offset in the file
	Size   int64       `json:"s"`           // uncompressed size
	Stored blob.Digest `json:"z,omitempty"` // blob holding the zstd form, if compressed
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

// Index is a layer's metadata; its blob digest is the layer's identity.
type Index struct {
	Version int     `json:"version"`
	Entries []Entry `json:"entries"` // sorted by Path; parents before children
	// Size is the sum of regular file sizes.
	Size int64 `json:"size"`
}
