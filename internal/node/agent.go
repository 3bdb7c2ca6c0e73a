// Package node is the node agent: everything that happens on one host
// (sandboxes, execs, files, images on the node, stats, capacity). The
// control plane talks to it only through the Agent interface, whose methods
// take and return plain data so the interface can become RPC between
// machines without changing callers. Nothing here assumes it is the only
// node.
package node

import (
	"context"
	"io"
	"os"
	"time"

	"github.com/dsec-dev/dsec/internal/runtime"
)

// Sandbox states.
const (
	StateCreating = "creating"
	StateRunning  = "running"
	StatePaused   = "paused"
	StateDead     = "dead" // its processes died outside dsec's control
	StateDeleted  = "deleted"
)

// QoS classes.
const (
	QoSLatency  = "latency"
	QoSStandard = "standard"
	QoSBatch    = "batch"
)

// NetworkRule is one egress rule.
type NetworkRule struct {
	CIDR     string `json:"cidr,omitempty"`     // "10.0.0.0/8", "1.2.3.4" (a /32)
	Ports    string `json:"ports,omitempty"`    // "443", "8000-9000"; empty = all
	Protocol string `json:"protocol,omitempty"` // "tcp", "udp"; empty = both
	Preset   string `json:"preset,omitempty"`   // "pypi", "npm", ...: operator-mapped endpoints
}

// NetworkPolicy is a sandbox's egress policy. The zero value is loopback only.
type NetworkPolicy struct {
	Allow []NetworkRule `json:"allow,omitempty"`
	Deny  []NetworkRule `json:"deny,omitempty"`
}

// SandboxSpec is what a caller asks for. Quantities: CPU in cores, bytes for
// memory and disk.
type SandboxSpec struct {
	ID          string            `json:"id"`
	Tenant      string            `json:"tenant"`
	Image       string            `json:"image"`        // NAME[:TAG]
	CPU         float64           `json:"cpu"`          // request (cores)
	CPULimit    float64           `json:"cpu_limit"`    // 0 = none
	MemoryBytes int64             `json:"memory_bytes"` // limit
	Pids        int64             `json:"pids"`
	DiskBytes   int64             `json:"disk_bytes"`
	IdleTTL     time.Duration     `json:"idle_ttl"`
	MaxLifetime time.Duration     `json:"max_lifetime"`
	OnIdle      string            `json:"on_idle"` // "delete" (default) or "pause"
	Env         []string          `json:"env,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Network     NetworkPolicy     `json:"network"`
	QoS         string            `json:"qos"`
	AllowUserNS bool              `json:"allow_userns,omitempty"`
	// FromSandbox, if set, starts the new sandbox with a copy of that
	// sandbox's file-system state (fork).
	FromSandbox string `json:"from_sandbox,omitempty"`
	// ForkGroup makes the forks of one request share one commit of the
	// source: every create with the same FromSandbox and ForkGroup starts
	// from the same point in time, and the source's upper is read once.
	ForkGroup string `json:"fork_group,omitempty"`
}

// Sandbox is the node's view of one sandbox.
type Sandbox struct {
	Spec   SandboxSpec `json:"spec"`
	ID     string      `json:"id"`
	Node   string      `json:"node"`
	State  string      `json:"state"`
	Reason string      `json:"reason,omitempty"` // why dead
	// ImagePinned is the exact image version (NAME@sha256:...) the sandbox
	// started from; snapshots build on it and GC keeps it.
	ImagePinned  string        `json:"image_pinned,omitempty"`
	CreatedAt    time.Time     `json:"created_at"`
	LastActivity time.Time     `json:"last_activity"`
	Runtime      runtime.State `json:"runtime"`
}

// SandboxStats are live figures for one sandbox.
type SandboxStats struct {
	ID                     string  `json:"id"`
	State                  string  `json:"state"`
	CPURequested           float64 `json:"cpu_requested"`
	CPUUsed                float64 `json:"cpu_used"` // cores, recent rate
	CPUUsedP50             float64 `json:"cpu_used_p50"`
	CPUUsedP95             float64 `json:"cpu_used_p95"`
	CPUThrottledSeconds    float64 `json:"cpu_throttled_seconds"`
	CPUUsageSeconds        float64 `json:"cpu_usage_seconds"`
	MemoryLimitBytes       int64   `json:"memory_limit_bytes"`
	MemoryHeldBytes        int64   `json:"memory_held_bytes"`
	MemoryReclaimableBytes int64   `json:"memory_reclaimable_bytes"`
	MemoryAnonBytes        int64   `json:"memory_anon_bytes"`
	MemoryFileBytes        int64   `json:"memory_file_bytes"`
	MemoryShmemBytes       int64   `json:"memory_shmem_bytes"`
	MemoryKernelBytes      int64   `json:"memory_kernel_bytes"`
	MemorySwappedBytes     int64   `json:"memory_swapped_bytes"`
	// MemoryReusableBytes: of held, clean page cache the host could take
	// back now; MemoryCompressedBytes: the group's zswap pool size (v2).
	MemoryReusableBytes   int64 `json:"memory_reusable_bytes"`
	MemoryCompressedBytes int64 `json:"memory_compressed_bytes,omitempty"`
	PidsCurrent           int64 `json:"pids_current"`
	// DiskUsedBytes is the private layer's size. With btrfs subvolumes
	// (the default) it is the quota's count, which includes a write once
	// btrfs commits it (every 30 s at most); the limit itself applies at
	// once.
	DiskUsedBytes       int64   `json:"disk_used_bytes"`
	OOMKills            int64   `json:"oom_kills"`
	MemoryPressureAvg10 float64 `json:"memory_pressure_avg10,omitempty"`
	CPUPressureAvg10    float64 `json:"cpu_pressure_avg10,omitempty"`
}

// ExecRequest runs one process in a sandbox.
type ExecRequest struct {
	SandboxID string        `json:"sandbox_id"`
	Args      []string      `json:"args,omitempty"`
	Shell     string        `json:"shell,omitempty"` // run via /bin/sh -c when set
	Env       []string      `json:"env,omitempty"`
	Cwd       string        `json:"cwd,omitempty"`
	User      string        `json:"user,omitempty"`
	Timeout   time.Duration `json:"timeout,omitempty"`
	OutputCap int64         `json:"output_cap,omitempty"`
	Tag       string        `json:"tag,omitempty"` // caller's label (E2B process tag)
}

// ExecInfo describes an exec known to the node.
type ExecInfo struct {
	ExecID    string              `json:"exec_id"`
	SandboxID string              `json:"sandbox_id"`
	Pid       int                 `json:"pid"`
	Request   ExecRequest         `json:"request"`
	Running   bool                `json:"running"`
	Result    *runtime.ExecResult `json:"result,omitempty"`
	StartedAt time.Time           `json:"started_at"`
}

// FileInfo describes a file inside a sandbox.
type FileInfo struct {
	Name    string      `json:"name"`
	Path    string      `json:"path"`
	Size    int64       `json:"size"`
	Mode    os.FileMode `json:"mode"`
	ModTime time.Time   `json:"mod_time"`
	IsDir   bool        `json:"is_dir"`
	Symlink string      `json:"symlink,omitempty"`
	UID     int         `json:"uid"`
	GID     int         `json:"gid"`
}

// NodeInfo describes a node and what it has left.
type NodeInfo struct {
	Name                   string            `json:"name"`
	CPUs                   int               `json:"cpus"`
	MemoryBytes            int64             `json:"memory_bytes"`
	MemAvailable           int64             `json:"mem_available_bytes"`
	Sandboxes              int               `json:"sandboxes"`
	CPURequested           float64           `json:"cpu_requested"`
	CPUUsed                float64           `json:"cpu_used"`
	MemoryHeldBytes        int64             `json:"memory_held_bytes"`
	MemoryReclaimableBytes int64             `json:"memory_reclaimable_bytes"`
	CgroupVersion          int               `json:"cgroup_version"`
	SchedCore              bool              `json:"sched_core"`
	Features               map[string]string `json:"features,omitempty"`
}

// Capacity answers "how many more sandboxes of this shape fit here".
type Capacity struct {
	Fits             int            `json:"fits"`
	LimitingResource string         `json:"limiting_resource"` // "cpu", "memory", "pids", "disk"
	Detail           map[string]int `json:"detail,omitempty"`  // fits per resource
}

// Agent is what the control plane asks of one host.
type Agent interface {
	Info(ctx context.Context) (*NodeInfo, error)
	Capacity(ctx context.Context, shape SandboxSpec) (*Capacity, error)

	CreateSandbox(ctx context.Context, spec SandboxSpec) (*Sandbox, error)
	GetSandbox(ctx context.Context, id string) (*Sandbox, error)
	ListSandboxes(ctx context.Context) ([]Sandbox, error)
	PauseSandbox(ctx context.Context, id string) error
	ResumeSandbox(ctx context.Context, id string) error
	DeleteSandbox(ctx context.Context, id string) error
	SandboxStats(ctx context.Context, id string) (*SandboxStats, error)
	SetNetwork(ctx context.Context, id string, p NetworkPolicy) error
	// Snapshot commits the sandbox's private layer as a new image version.
	Snapshot(ctx context.Context, id, imageRef string) (string, error)

	// StartExec starts a process; output goes to the writers in pio.
	StartExec(ctx context.Context, req ExecRequest, pio runtime.IO) (*ExecInfo, error)
	WaitExec(ctx context.Context, sandboxID, execID string) (*runtime.ExecResult, error)
	GetExec(ctx context.Context, sandboxID, execID string) (*ExecInfo, error)
	ListExecs(ctx context.Context, sandboxID string) ([]ExecInfo, error)
	SignalExec(ctx context.Context, sandboxID, execID string, signal int) error
	// ExecOutput reads the kept tail of an exec's "stdout" or "stderr"
	// (at most its output cap), with its size in bytes.
	ExecOutput(ctx context.Context, sandboxID, execID, stream string) (io.ReadCloser, int64, error)

	ReadFile(ctx context.Context, sandboxID, path string) (io.ReadCloser, *FileInfo, error)
	WriteFile(ctx context.Context, sandboxID, path string, mode os.FileMode, r io.Reader) (*FileInfo, error)
	StatFile(ctx context.Context, sandboxID, path string) (*FileInfo, error)
	ListDir(ctx context.Context, sandboxID, path string, depth int) ([]FileInfo, error)
	MakeDir(ctx context.Context, sandboxID, path string, mode os.FileMode) error
	Remove(ctx context.Context, sandboxID, path string, recursive bool) error
	Rename(ctx context.Context, sandboxID, from, to string) error
}
