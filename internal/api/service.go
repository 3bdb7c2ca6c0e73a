package api

import (
	"context"
	"io"
	"os"
	"time"

	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/runtime"
)

// Caller is the authenticated principal of a request.
type Caller struct {
	Tenant  string // tenant name; "" never reaches the service
	Admin   bool   // the root tenant (unix socket as root, or an admin token)
	TokenID string
}

// Tenant is an API customer with quotas.
type Tenant struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	Quota     Quota     `json:"quota"`
	Admin     bool      `json:"admin,omitempty"`
}

// Quota limits what one tenant may hold at once. Zero = unlimited.
type Quota struct {
	Sandboxes   int     `json:"sandboxes,omitempty"`
	CPU         float64 `json:"cpu,omitempty"`
	MemoryBytes int64   `json:"memory_bytes,omitempty"`
	DiskBytes   int64   `json:"disk_bytes,omitempty"`
}

// Token is an API token's metadata; the secret is shown once at creation.
type Token struct {
	ID        string    `json:"id"`
	Tenant    string    `json:"tenant"`
	CreatedAt time.Time `json:"created_at"`
	Revoked   bool      `json:"revoked,omitempty"`
	// Secret is set only in the reply to CreateToken.
	Secret string `json:"secret,omitempty"`
}

// ImageInfo describes a stored image version.
type ImageInfo struct {
	Name      string    `json:"name"` // NAME:TAG
	Digest    string    `json:"digest"`
	Layers    []string  `json:"layers"`
	Size      int64     `json:"size"`
	Owner     string    `json:"owner"`
	Public    bool      `json:"public"`
	CreatedAt time.Time `json:"created_at"`
}

// ImportProgress reports a long import.
type ImportProgress struct {
	Layer       int   `json:"layer"`
	Layers      int   `json:"layers"`
	Bytes       int64 `json:"bytes"`
	BytesPerSec int64 `json:"bytes_per_sec"`
	Done        bool  `json:"done,omitempty"`
}

// GCResult reports what an image GC removed.
type GCResult struct {
	RemovedBlobs int   `json:"removed_blobs"`
	FreedBytes   int64 `json:"freed_bytes"`
	KeptBlobs    int   `json:"kept_blobs"`
}

// ImageStats are lazy-loading figures of one image on one node.
type ImageStats struct {
	Image      string `json:"image"`
	ImageBytes int64  `json:"image_bytes"`
	// FetchedBytes: chunks fetched from the store, uncompressed size.
	FetchedBytes int64 `json:"fetched_bytes"`
	// TransferredBytes: what those fetches read from the store (chunks as
	// stored, zstd-compressed where that saved space).
	TransferredBytes int64 `json:"transferred_bytes"`
	ReadBytes        int64 `json:"read_bytes"`
	// MetadataRequests: FUSE requests other than reads that reached the
	// layer daemon (the kernel answers the rest from its caches).
	MetadataRequests uint64  `json:"metadata_requests"`
	CacheHits        int64   `json:"cache_hits"`
	CacheMisses      int64   `json:"cache_misses"`
	HitRatio         float64 `json:"hit_ratio"`
	FetchWaitSecs    float64 `json:"fetch_wait_seconds"`
}

// ListFilter selects sandboxes.
type ListFilter struct {
	Labels map[string]string
	State  string
}

// Service is the control plane: every face (native HTTP API, E2B API, CLI
// via SDK) goes through it, so auth, quotas, placement and audit apply the
// same way everywhere. Errors are errdefs classes; a sandbox of another
// tenant is ErrNotFound.
type Service interface {
	CreateSandbox(ctx context.Context, c Caller, spec node.SandboxSpec) (*node.Sandbox, error)
	GetSandbox(ctx context.Context, c Caller, id string) (*node.Sandbox, error)
	ListSandboxes(ctx context.Context, c Caller, f ListFilter) ([]node.Sandbox, error)
	DeleteSandbox(ctx context.Context, c Caller, id string) error
	PauseSandbox(ctx context.Context, c Caller, id string) error
	ResumeSandbox(ctx context.Context, c Caller, id string) error
	// SetTimeout changes the sandbox's max lifetime to now+d (E2B semantics).
	SetTimeout(ctx context.Context, c Caller, id string, d time.Duration) error
	SandboxStats(ctx context.Context, c Caller, id string) (*node.SandboxStats, error)
	SetNetwork(ctx context.Context, c Caller, id string, p node.NetworkPolicy) error
	Snapshot(ctx context.Context, c Caller, id, imageRef string) (*ImageInfo, error)
	Fork(ctx context.Context, c Caller, id string, count int) ([]node.Sandbox, error)

	StartExec(ctx context.Context, c Caller, req node.ExecRequest, pio runtime.IO) (*node.ExecInfo, error)
	WaitExec(ctx context.Context, c Caller, sandboxID, execID string) (*runtime.ExecResult, error)
	GetExec(ctx context.Context, c Caller, sandboxID, execID string) (*node.ExecInfo, error)
	ListExecs(ctx context.Context, c Caller, sandboxID string) ([]node.ExecInfo, error)
	SignalExec(ctx context.Context, c Caller, sandboxID, execID string, signal int) error
	// ExecOutput reads the kept tail of an exec's "stdout" or "stderr"
	// (at most its output cap), with its size, while its sandbox lives.
	ExecOutput(ctx context.Context, c Caller, sandboxID, execID, stream string) (io.ReadCloser, int64, error)

	ReadFile(ctx context.Context, c Caller, sandboxID, path string) (io.ReadCloser, *node.FileInfo, error)
	WriteFile(ctx context.Context, c Caller, sandboxID, path string, mode os.FileMode, r io.Reader) (*node.FileInfo, error)
	StatFile(ctx context.Context, c Caller, sandboxID, path string) (*node.FileInfo, error)
	ListDir(ctx context.Context, c Caller, sandboxID, path string, depth int) ([]node.FileInfo, error)
	MakeDir(ctx context.Context, c Caller, sandboxID, path string, mode os.FileMode) error
	Remove(ctx context.Context, c Caller, sandboxID, path string, recursive bool) error
	Rename(ctx context.Context, c Caller, sandboxID, from, to string) error

	// ImportImage imports from a path on the server's host (admin only:
	// OCI layout dir, OCI/docker-archive tar, rootfs dir or rootfs tar) or,
	// when r is non-nil, from an uploaded tar stream. progress may be nil.
	ImportImage(ctx context.Context, c Caller, ref, path string, r io.Reader, public bool, progress func(ImportProgress)) (*ImageInfo, error)
	ListImages(ctx context.Context, c Caller) ([]ImageInfo, error)
	GetImage(ctx context.Context, c Caller, ref string) (*ImageInfo, error)
	RemoveImage(ctx context.Context, c Caller, ref string) error
	GCImages(ctx context.Context, c Caller) (*GCResult, error)
	ImageStats(ctx context.Context, c Caller, ref string) (*ImageStats, error)

	// Authenticate maps a bearer token (or E2B API key) to its caller.
	Authenticate(ctx context.Context, secret string) (Caller, error)
	CreateTenant(ctx context.Context, c Caller, t Tenant) (*Tenant, error)
	ListTenants(ctx context.Context, c Caller) ([]Tenant, error)
	DeleteTenant(ctx context.Context, c Caller, name string) error
	// CreateToken issues a token for tenant; by default its secret is
	// "dsec_<hex>", WithTokenPrefix("e2b_") gives an E2B-shaped API key.
	CreateToken(ctx context.Context, c Caller, tenant string, opts ...TokenOption) (*Token, error)
	RevokeToken(ctx context.Context, c Caller, id string) error

	NodeInfo(ctx context.Context, c Caller) ([]node.NodeInfo, error)
	Capacity(ctx context.Context, c Caller, shape node.SandboxSpec) (*node.Capacity, error)
}

// Puller is the optional role of a Service that pulls images from a
// registry (POST /v1/images/pull). It is separate from Service so that
// services without network access to registries need not implement it.
type Puller interface {
	// PullImage fetches ref (e.g. registry.example:5000/team/img:1, or
	// python:3.12 from Docker Hub) and stores it under its repository path
	// without the registry host (team/img:1, python:3.12). Admin only: it
	// makes the server reach out to the network.
	PullImage(ctx context.Context, c Caller, ref string, public bool, progress func(ImportProgress)) (*ImageInfo, error)
}
