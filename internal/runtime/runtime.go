package runtime

import (
	"context"
	"io"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/internal/cgroups"
)

// Spec is everything needed to create one sandbox.
type Spec struct {
	ID       string
	Hostname string
	// Dir is the sandbox's private state directory on the host (upper, work,
	// exec logs). It is created by the runtime and removed by Destroy.
	Dir string
	// Lower are the read-only layer directories, top-most first, as overlayfs
	// lowerdir wants them.
	Lower []string
	// Env is the default environment for execs.
	Env       []string
	Resources cgroups.Resources
	// DiskBytes caps the private writable layer. 0 = the runtime default.
	DiskBytes int64
	// NetNSPath, if set, is a prepared network namespace to join; otherwise
	// the sandbox gets a fresh one with loopback only.
	NetNSPath string
	// AllowUserNS lets processes create user namespaces (off by default).
	AllowUserNS bool
	// OwnSysfs mounts a sysfs of the sandbox's own network namespace even
	// where the runtime would bind its shared one (WithSharedSysfs): for a
	// sandbox that will be given network devices, which only its own
	// sysfs shows.
	OwnSysfs bool
}

// State is what must be persisted so a restarted server can Adopt a
// running sandbox. It is plain data (JSON-serialisable).
type State struct {
	ID        string            `json:"id"`
	Pid       int               `json:"pid"`
	PidStart  uint64            `json:"pid_start"` // /proc/PID/stat starttime, guards against pid reuse
	Dir       string            `json:"dir"`
	Cgroup    string            `json:"cgroup"`
	Paused    bool              `json:"paused"`
	CreatedAt time.Time         `json:"created_at"`
	Extra     map[string]string `json:"extra,omitempty"`
}

// Process describes one exec.
type Process struct {
	Args    []string // argv; Args[0] is looked up in PATH inside the sandbox
	Env     []string // added to/overriding the sandbox env
	Cwd     string
	User    string // name or uid[:gid]; default root
	Timeout time.Duration
	// OutputCap caps stdout and stderr kept for the exec (each); the tail
	// is kept. 0 = runtime default (16 MiB).
	OutputCap int64
	Tty       bool
	// Record is the caller's own record of the exec (one line, no
	// newline), kept with its result: ExecState returns it, also to a
	// restarted server.
	Record []byte
}

// IO connects a process to the caller. Nil Stdin means /dev/null.
type IO struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// ExecResult is how a process ended.
type ExecResult struct {
	ExecID          string        `json:"exec_id"`
	Pid             int           `json:"pid"`
	ExitCode        int           `json:"exit_code"`
	Signal          string        `json:"signal,omitempty"`
	TimedOut        bool          `json:"timed_out,omitempty"`
	StdoutTruncated bool          `json:"stdout_truncated,omitempty"`
	StderrTruncated bool          `json:"stderr_truncated,omitempty"`
	OutputCap       int64         `json:"output_cap"`
	Duration        time.Duration `json:"duration_ns"`
	// OutputBytes is what the node keeps of the output (both streams), on
	// disk until the exec is pruned or its sandbox deleted.
	OutputBytes int64 `json:"output_bytes,omitempty"`
}

// ExecState is what the runtime keeps of an exec.
type ExecState struct {
	Record []byte      // the Process.Record it was started with (nil if none)
	Pid    int         // host pid of its process (0 if not known yet)
	Result *ExecResult // how it ended; nil while it runs, or if Lost
	// Lost: its shim died without recording a result (its sandbox was
	// destroyed, or it was killed).
	Lost bool
}

// Exec is a started process.
type Exec interface {
	ID() string
	Pid() int // host pid
	Signal(sig syscall.Signal) error
	// Wait blocks until the process has ended and its output is flushed.
	Wait(ctx context.Context) (*ExecResult, error)
}

// Run is Start followed by Wait; cancelling ctx kills the process.
func Run(ctx context.Context, rt Runtime, id string, p Process, pio IO) (*ExecResult, error) {
	e, err := rt.Start(ctx, id, p, pio)
	if err != nil {
		return nil, err
	}
	res, err := e.Wait(ctx)
	if err != nil && ctx.Err() != nil {
		_ = e.Signal(syscall.SIGKILL)
	}
	return res, err
}

// Runtime is the node-local sandbox mechanism.
type Runtime interface {
	Create(ctx context.Context, spec Spec) (*State, error)
	// Start starts a process inside the sandbox. Output streams to io as
	// it is produced; the process is killed when p.Timeout passes. ctx
	// bounds only the start. A process survives a restart of the server:
	// its output and result are also kept under the sandbox's Dir.
	Start(ctx context.Context, id string, p Process, io IO) (Exec, error)
	// ExecResult returns the recorded result of a finished exec, also one
	// that ended while no server was running. done=false while it runs.
	ExecResult(id, execID string) (res *ExecResult, done bool, err error)
	// OpenExecOutput reads the kept tail of an exec's "stdout" or
	// "stderr", with its size in bytes.
	OpenExecOutput(id, execID, stream string) (io.ReadCloser, int64, error)
	// RemoveExec forgets an ended exec: its result and kept output. A
	// running exec is an ErrFailedPrecondition error.
	RemoveExec(id, execID string) error
	// ExecState reads what is kept of an exec, record and result, in one
	// read.
	ExecState(id, execID string) (*ExecState, error)
	// ListExecs lists the IDs of the execs a sandbox keeps, running and
	// ended.
	ListExecs(id string) ([]string, error)
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	// Destroy kills every process and removes every mount, cgroup and
	// directory of the sandbox. Destroying a missing sandbox is not an error.
	Destroy(ctx context.Context, id string) error
	// Adopt takes over a sandbox started by an earlier server process.
	// It returns errdefs.ErrNotFound-wrapped error if its processes are gone.
	Adopt(ctx context.Context, st State) error
	// RootFS returns a host path through which the sandbox's root file
	// system can be reached (for the file API; resolve inside it only with
	// RESOLVE_IN_ROOT).
	RootFS(id string) (string, error)
	// UpperDir is the sandbox's private writable layer (for snapshots).
	UpperDir(id string) (string, error)
	Stats(id string) (*cgroups.Stats, error)
	// Alive reports whether the sandbox's init still runs.
	Alive(id string) bool
}
