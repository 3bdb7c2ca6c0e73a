package api

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
)

// AdminTenant is the built-in tenant of the admin caller.
const AdminTenant = "admin"

// AdminCaller is the caller of the unix socket and of in-process tools.
var AdminCaller = Caller{Tenant: AdminTenant, Admin: true, TokenID: "local"}

// systemCaller is used for actions the control plane takes on its own
// (lifecycle timers, reconciliation); the audit log names it.
var systemCaller = Caller{Tenant: AdminTenant, Admin: true, TokenID: "system"}

// Clock tells the time; tests inject a fake one to drive lifecycle timers.
type Clock interface {
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Config configures the control plane. Zero fields take the defaults below.
type Config struct {
	// DataDir holds the audit log. The state store is opened by the
	// caller (it may be remote), so it is not placed here.
	DataDir string
	// Defaults fill zero resource fields of a SandboxSpec before quotas
	// are checked, so what is reserved is what the node is asked for.
	DefaultCPU         float64       // default 1
	DefaultMemoryBytes int64         // default 512 MiB
	DefaultDiskBytes   int64         // 0 = a sandbox that names no disk limit gets none
	DefaultIdleTTL     time.Duration // 0 = no idle timeout unless the spec asks
	DefaultMaxLifetime time.Duration // 0 = unlimited unless the spec asks
	// MaxLifetimeCap bounds MaxLifetime and SetTimeout (0 = no cap).
	MaxLifetimeCap time.Duration
	// MaxFork bounds one Fork call (default 64).
	MaxFork int
	// ReapInterval is how often lifecycle timers are checked (default 1s).
	ReapInterval time.Duration
	// ActivityPersistEvery bounds how stale the persisted last-activity
	// time of a sandbox may be (default 10s): activity is tracked in
	// memory on every call and written to the store at most this often,
	// so busy sandboxes don't turn every exec into a disk write.
	ActivityPersistEvery time.Duration
	// AuditMaxBytes rotates the audit log at this size (default 64 MiB),
	// keeping AuditKeep old files (default 5).
	AuditMaxBytes int64
	AuditKeep     int
	// NodeTimeout bounds control-plane calls to nodes made on its own
	// behalf (reconcile, timers, metrics); default 30s.
	NodeTimeout time.Duration
	// ExecHistory is how many ended execs' results are kept per sandbox,
	// the oldest forgotten first (default node.DefaultMaxEndedExecs); the
	// node bounds their kept output (node.ExecRetention).
	ExecHistory int
	Clock       Clock
}

func (c *Config) setDefaults() error {
	if c.DataDir == "" {
		return fmt.Errorf("api: config: DataDir is required: %w", errdefs.ErrInvalidArgument)
	}
	if c.DefaultCPU == 0 {
		c.DefaultCPU = 1
	}
	if c.DefaultMemoryBytes == 0 {
		c.DefaultMemoryBytes = 512 << 20
	}
	if c.MaxFork == 0 {
		c.MaxFork = 64
	}
	if c.ReapInterval == 0 {
		c.ReapInterval = time.Second
	}
	if c.ActivityPersistEvery == 0 {
		c.ActivityPersistEvery = 10 * time.Second
	}
	if c.AuditMaxBytes == 0 {
		c.AuditMaxBytes = 64 << 20
	}
	if c.AuditKeep == 0 {
		c.AuditKeep = 5
	}
	if c.NodeTimeout == 0 {
		c.NodeTimeout = 30 * time.Second
	}
	if c.ExecHistory == 0 {
		c.ExecHistory = node.DefaultMaxEndedExecs
	}
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	if c.DefaultCPU < 0 || c.DefaultMemoryBytes < 0 || c.DefaultDiskBytes < 0 || c.DefaultIdleTTL < 0 ||
		c.DefaultMaxLifetime < 0 || c.MaxLifetimeCap < 0 || c.MaxFork < 0 || c.ReapInterval < 0 || c.AuditMaxBytes < 0 || c.ExecHistory < 0 {
		return fmt.Errorf("api: config: negative value: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// NodeSet gives the control plane its nodes: one in-process Agent today,
// remote agents behind the same interface later.
type NodeSet interface {
	// Nodes lists node names in a stable order.
	Nodes() []string
	// Node returns a node's Agent, or an ErrNotFound-wrapped error.
	Node(name string) (node.Agent, error)
}

// StaticNodes is a fixed NodeSet: node name -> Agent.
type StaticNodes map[string]node.Agent

// Nodes implements NodeSet.
func (s StaticNodes) Nodes() []string {
	names := make([]string, 0, len(s))
	for n := range s {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Node implements NodeSet.
func (s StaticNodes) Node(name string) (node.Agent, error) {
	a, ok := s[name]
	if !ok {
		return nil, fmt.Errorf("node %q: %w", name, errdefs.ErrNotFound)
	}
	return a, nil
}

// ImageManager is what the control plane needs from the image store. It
// knows nothing of tenants: ownership and visibility are kept by the
// control plane (the images-acl bucket). Refs are NAME[:TAG]; a missing
// tag means "latest". Returned ImageInfo need not set Owner or Public.
// Snapshots are committed by the node (node.Agent.Snapshot), which then
// calls Resolve for the new version.
type ImageManager interface {
	ImageImporter
	ImageLister
	// Remove deletes one image version (NAME:TAG).
	Remove(ctx context.Context, ref string) error
	// GC removes blobs no image version references.
	GC(ctx context.Context) (*GCResult, error)
	// Stats returns lazy-loading figures of an image.
	Stats(ctx context.Context, ref string) (*ImageStats, error)
}

// ImageImporter imports images.
type ImageImporter interface {
	// ImportPath imports from a path on the server host (OCI layout dir,
	// OCI or docker-archive tar, rootfs dir or rootfs tar).
	ImportPath(ctx context.Context, ref, path string, progress func(ImportProgress)) (*ImageInfo, error)
	// ImportTar imports an uploaded tar stream (any tar form ImportPath
	// accepts), reading r once to its end.
	ImportTar(ctx context.Context, ref string, r io.Reader, progress func(ImportProgress)) (*ImageInfo, error)
}

// ImagePuller is the optional role of an ImageManager that pulls from a
// registry: src is the registry reference, ref the local NAME:TAG.
type ImagePuller interface {
	Pull(ctx context.Context, src, ref string, progress func(ImportProgress)) (*ImageInfo, error)
}

// ImageLister looks images up.
type ImageLister interface {
	// Resolve returns one image version, or an ErrNotFound-wrapped error.
	Resolve(ctx context.Context, ref string) (*ImageInfo, error)
	List(ctx context.Context) ([]ImageInfo, error)
}

// TokenOption configures CreateToken.
type TokenOption func(*tokenOptions)

type tokenOptions struct {
	prefix string
}

// Token secret prefixes.
const (
	TokenPrefixNative = "dsec_"
	TokenPrefixE2B    = "e2b_"
)

// WithTokenPrefix sets the secret's prefix: TokenPrefixNative (default) or
// TokenPrefixE2B for E2B-shaped API keys.
func WithTokenPrefix(p string) TokenOption { return func(o *tokenOptions) { o.prefix = p } }
