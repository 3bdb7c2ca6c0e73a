package node

import (
	"context"
	"io"
	"os"
)

// The local agent is assembled from these narrow roles. Each is defined
// here, next to its consumer, and implemented by a mechanism package that
// knows nothing of the agent; cmd/dsec wires them together.

// ImageResolver maps an image reference to the exact version it names now
// (a pinned reference such as NAME@sha256:..., which later tag moves do not
// change) and its layers, bottom-first.
type ImageResolver interface {
	ResolveImage(ctx context.Context, ref string) (pinned string, layers []string, err error)
}

// LayerProvider makes a layer available as a read-only directory shared by
// every sandbox on the node (a FUSE mount or an unpacked directory). Leases
// are keyed by (layer, holder) so acquiring again after a restart is
// idempotent; Sync drops the leases of holders that no longer exist.
type LayerProvider interface {
	Acquire(ctx context.Context, layer, holder string) (path string, err error)
	Release(ctx context.Context, layer, holder string) error
	Sync(ctx context.Context, liveHolders []string) error
}

// LayerCommitter turns a sandbox's private overlay upper dir into a new
// layer on top of base's layers and records it as image newRef. It returns
// the new image's reference as stored (NAME:TAG).
type LayerCommitter interface {
	CommitUpper(ctx context.Context, baseRef, upperDir, newRef string) (string, error)
}

// ImageRemover is an optional role of the LayerCommitter: it deletes a
// tag. The version stays readable by its pinned reference, and GC keeps
// what live sandboxes pin.
type ImageRemover interface {
	Remove(ctx context.Context, ref string) error
}

// Network gives a sandbox egress according to a policy. Sandboxes whose
// policy allows nothing are never attached.
type Network interface {
	Attach(ctx context.Context, sandboxID string, pid int, p NetworkPolicy) error
	Update(ctx context.Context, sandboxID string, p NetworkPolicy) error
	Detach(ctx context.Context, sandboxID string) error
}

// FileRoot is a sandbox's root file system, with every path resolved inside it.
type FileRoot interface {
	Open(path string) (io.ReadCloser, *FileInfo, error)
	WriteFile(path string, mode os.FileMode, r io.Reader) (*FileInfo, error)
	Stat(path string) (*FileInfo, error)
	ListDir(path string, depth int) ([]FileInfo, error)
	MkdirAll(path string, mode os.FileMode) error
	Remove(path string, recursive bool) error
	Rename(from, to string) error
	Close() error
}

// FileRootOpener opens a FileRoot on a host directory.
type FileRootOpener func(dir string) (FileRoot, error)

// Admission decides whether one more sandbox of a shape fits on this node,
// from measured use. It returns an errdefs.ErrResourceExhausted-wrapped
// error naming the short resource when it does not.
type Admission interface {
	Admit(ctx context.Context, shape SandboxSpec) error
	Capacity(ctx context.Context, shape SandboxSpec) (*Capacity, error)
}

// OrphanReaper removes everything the runtime made for a sandbox the agent
// has no record of (processes, cgroup, the directory dir), knowing only its
// id and directory: a create or delete cut short by a crash of the server.
type OrphanReaper interface {
	ReapOrphan(ctx context.Context, id, dir string) error
}
