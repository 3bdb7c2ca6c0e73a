package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/rootfs"
	"github.com/dsec-dev/dsec/internal/runtime/shim"
)

// DefaultCaps is docker's default capability set: the bounding set of
// every sandbox process and the effective set of root inside.
const DefaultCaps uint64 = 1<<unix.CAP_CHOWN | 1<<unix.CAP_DAC_OVERRIDE | 1<<unix.CAP_FOWNER |
	1<<unix.CAP_FSETID | 1<<unix.CAP_KILL | 1<<unix.CAP_SETGID | 1<<unix.CAP_SETUID |
	1<<unix.CAP_SETPCAP | 1<<unix.CAP_NET_BIND_SERVICE | 1<<unix.CAP_NET_RAW |
	1<<unix.CAP_SYS_CHROOT | 1<<unix.CAP_MKNOD | 1<<unix.CAP_AUDIT_WRITE | 1<<unix.CAP_SETFCAP

// DefaultOutputCap is the per-stream cap of kept exec output.
const DefaultOutputCap = 16 << 20

// DefaultPath is added to an exec's environment when it has no PATH.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// SeccompFunc builds the seccomp program for a sandbox (nil = none).
type SeccompFunc func(Spec) ([]unix.SockFilter, error)

// Option configures a NamespaceRuntime.
type Option func(*NamespaceRuntime) error

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option {
	return func(r *NamespaceRuntime) error { r.log = l; return nil }
}

// WithShimPath sets the binary started as init and exec shim; it must link
// package shim. Default /proc/self/exe.
func WithShimPath(p string) Option {
	return func(r *NamespaceRuntime) error { r.shimPath = p; return nil }
}

// WithSharedSysfs makes sandboxes with a loopback-only network namespace
// bind one read-only sysfs, mounted in dir (a private directory of the
// node's) on first use and unmounted by Close if no sandbox is left,
// instead of mounting their own (see sharedSysfs). Without it each sandbox
// mounts its own sysfs.
func WithSharedSysfs(dir string) Option {
	return func(r *NamespaceRuntime) error {
		if !filepath.IsAbs(dir) {
			return fmt.Errorf("shared sysfs dir %q is not absolute: %w", dir, errdefs.ErrInvalidArgument)
		}
		r.sysfs = &sharedSysfs{dir: dir}
		return nil
	}
}

// WithCgroupParent sets the cgroup under which sandboxes get their group
// (default "dsec/sandboxes").
func WithCgroupParent(name string) Option {
	return func(r *NamespaceRuntime) error { r.cgroupParent = strings.Trim(name, "/"); return nil }
}

// WithSeccomp installs the program f returns in every sandbox process (and
// the init), as the last step before execve.
func WithSeccomp(f SeccompFunc) Option {
	return func(r *NamespaceRuntime) error { r.seccomp = f; return nil }
}

// WithCapabilities replaces DefaultCaps.
func WithCapabilities(mask uint64) Option {
	return func(r *NamespaceRuntime) error { r.caps = mask; return nil }
}

// WithTmpfsSizes sets the room for /tmp and /dev/shm (defaults 256 MiB and
// 64 MiB; charged to the sandbox's memory cgroup). They are directories of
// one tmpfs (with /dev), which is tmp + shm + 64 kB large: either may use
// what the other leaves.
func WithTmpfsSizes(tmp, shm int64) Option {
	return func(r *NamespaceRuntime) error {
		if tmp <= 0 || shm <= 0 {
			return fmt.Errorf("tmpfs sizes must be positive: %w", errdefs.ErrInvalidArgument)
		}
		r.tmpSize, r.shmSize = tmp, shm
		return nil
	}
}

// WithDiskPool enables disk limits (Spec.DiskBytes > 0).
func WithDiskPool(p *rootfs.DiskPool) Option {
	return func(r *NamespaceRuntime) error { r.disks = p; return nil }
}

// WithSubvolumes puts every sandbox's private layer in a btrfs subvolume
// of sv (sandbox dirs must then be below sv.Root()); a disk limit is the
// subvolume's quota. It takes precedence over WithDiskPool.
func WithSubvolumes(sv *rootfs.Subvolumes) Option {
	return func(r *NamespaceRuntime) error { r.subvols = sv; return nil }
}

// WithOutputCap sets the default per-stream output cap of execs.
func WithOutputCap(n int64) Option {
	return func(r *NamespaceRuntime) error {
		if n <= 0 {
			return fmt.Errorf("output cap must be positive: %w", errdefs.ErrInvalidArgument)
		}
		r.outputCap = n
		return nil
	}
}

// NamespaceRuntime runs sandboxes as Linux namespaces with a C init (see
// package shim) and an overlay root.
type NamespaceRuntime struct {
	cg           cgroups.Manager
	log          *slog.Logger
	shimPath     string
	cgroupParent string
	seccomp      SeccompFunc
	caps         uint64
	tmpSize      int64
	shmSize      int64
	outputCap    int64
	disks        *rootfs.DiskPool
	subvols      *rootfs.Subvolumes
	sysfs        *sharedSysfs // nil: each sandbox mounts its own
	null         *os.File
	spawner      *spawner

	mu       sync.Mutex
	sbs      map[string]*sandbox // ready sandboxes
	creating map[string]bool     // ids reserved by a Create in progress
}

var _ Runtime = (*NamespaceRuntime)(nil)

type sandbox struct {
	id        string
	dir       string
	init      *proc
	start     uint64
	group     cgroups.Group
	upper     string
	env       []string
	filter    []byte
	netns     string
	userns    bool
	disk      bool
	createdAt time.Time

	mu     sync.Mutex // serialises pause/resume/destroy
	paused bool
	gone   bool
}

// NewNamespaceRuntime returns a runtime that puts sandboxes into groups of
// cg.
func NewNamespaceRuntime(cg cgroups.Manager, opts ...Option) (*NamespaceRuntime, error) {
	if cg == nil {
		return nil, fmt.Errorf("no cgroup manager: %w", errdefs.ErrInvalidArgument)
	}
	r := &NamespaceRuntime{
		cg: cg, log: slog.New(slog.DiscardHandler), shimPath: "/proc/self/exe",
		cgroupParent: "dsec/sandboxes", caps: DefaultCaps, tmpSize: 256 << 20, shmSize: 64 << 20,
		outputCap: DefaultOutputCap, sbs: map[string]*sandbox{}, creating: map[string]bool{},
	}
	for _, o := range opts {
		if err := o(r); err != nil {
			return nil, err
		}
	}
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	r.null = null
	r.spawner = newSpawner(r.shimPath, null, r.log)
	return r, nil
}

// Close releases the runtime's own resources (the spawner exits);
// sandboxes and execs keep running.
func (r *NamespaceRuntime) Close() error {
	r.spawner.close()
	r.mu.Lock()
	for _, sb := range r.sbs {
		_ = sb.init.close()
	}
	live := len(r.sbs)
	r.sbs = map[string]*sandbox{}
	r.mu.Unlock()
	var err error
	if r.sysfs != nil {
		err = r.sysfs.close(live)
	}
	return errors.Join(err, r.null.Close())
}

var idRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

func validateID(id string) error {
	if !idRE.MatchString(id) {
		return fmt.Errorf("sandbox id %q: want 1-63 of [a-zA-Z0-9_.-], starting alphanumeric: %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

func validateSpec(s *Spec) error {
	if err := validateID(s.ID); err != nil {
		return err
	}
	if s.Hostname == "" {
		s.Hostname = s.ID
	}
	if !idRE.MatchString(s.Hostname) {
		return fmt.Errorf("hostname %q is invalid: %w", s.Hostname, errdefs.ErrInvalidArgument)
	}
	if s.Dir == "" || !filepath.IsAbs(s.Dir) {
		return fmt.Errorf("sandbox dir %q must be an absolute path: %w", s.Dir, errdefs.ErrInvalidArgument)
	}
	if s.DiskBytes < 0 {
		return fmt.Errorf("disk bytes %d is negative: %w", s.DiskBytes, errdefs.ErrInvalidArgument)
	}
	for _, e := range s.Env {
		if !strings.Contains(e, "=") || strings.ContainsRune(e, 0) {
			return fmt.Errorf("env entry %q is not KEY=VALUE: %w", e, errdefs.ErrInvalidArgument)
		}
	}
	if s.NetNSPath != "" {
		var st unix.Statfs_t
		if err := unix.Statfs(s.NetNSPath, &st); err != nil {
			return fmt.Errorf("network namespace %s: %w", s.NetNSPath, errors.Join(errdefs.ErrInvalidArgument, err))
		}
		if st.Type != unix.NSFS_MAGIC {
			return fmt.Errorf("%s is not a namespace file: %w", s.NetNSPath, errdefs.ErrInvalidArgument)
		}
	}
	return rootfs.ValidateLower(s.Lower)
}

func (r *NamespaceRuntime) get(id string) (*sandbox, error) {
	r.mu.Lock()
	sb := r.sbs[id]
	r.mu.Unlock()
	if sb == nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

func (r *NamespaceRuntime) filterFor(s Spec) ([]byte, error) {
	if r.seccomp == nil {
		return nil, nil
	}
	f, err := r.seccomp(s)
	if err != nil {
		return nil, fmt.Errorf("seccomp filter: %w", err)
	}
	return filterBytes(f), nil
}

// Create starts the sandbox's init and returns once its root is ready.
func (r *NamespaceRuntime) Create(ctx context.Context, spec Spec) (_ *State, err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := validateSpec(&spec); err != nil {
		return nil, err
	}
	if spec.DiskBytes > 0 && r.disks == nil && r.subvols == nil {
		return nil, fmt.Errorf("disk limit requested but the runtime has no disk pool: %w", errdefs.ErrFailedPrecondition)
	}
	filter, err := r.filterFor(spec)
	if err != nil {
		return nil, err
	}
	sb := &sandbox{id: spec.ID, dir: spec.Dir, env: spec.Env, filter: filter, netns: spec.NetNSPath,
		userns: spec.AllowUserNS, createdAt: time.Now().UTC()}
	// Reserve the id so concurrent creates of it fail fast; the sandbox
	// becomes visible to other calls only once it is ready.
	r.mu.Lock()
	if r.sbs[spec.ID] != nil || r.creating[spec.ID] {
		r.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, errdefs.ErrAlreadyExists)
	}
	r.creating[spec.ID] = true
	r.mu.Unlock()
	var layout *rootfs.Layout
	defer func() {
		if err != nil {
			r.undoCreate(sb, layout)
		}
		r.mu.Lock()
		delete(r.creating, spec.ID)
		if err == nil {
			r.sbs[spec.ID] = sb
		}
		r.mu.Unlock()
	}()

	layout, err = rootfs.Prepare(ctx, spec.Dir, spec.Lower, spec.DiskBytes, rootfs.Disks{Subvolumes: r.subvols, Pool: r.disks})
	if err != nil {
		return nil, err
	}
	sb.group, err = r.cg.New(ctx, r.cgroupName(spec.ID), spec.Resources)
	if err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}

	var c shim.Config
	c.Add(shim.THostname, spec.Hostname)
	for _, l := range layout.Overlay.Lower {
		c.Add(shim.TLower, l)
	}
	c.Add(shim.TRoot, layout.Root)
	if d := layout.Disk; d != nil {
		c.Add(shim.TDiskDev, d.Loop.Path)
		c.Add(shim.TDiskDir, d.MountDir)
		c.Add(shim.TDiskFSType, d.FSType)
		sb.disk = true
	} else {
		c.Add(shim.TUpper, layout.Overlay.Upper)
		c.Add(shim.TWork, layout.Overlay.Work)
		sb.upper = layout.Overlay.Upper
	}
	if spec.NetNSPath != "" {
		c.Add(shim.TNetNS, spec.NetNSPath)
	} else if r.sysfs != nil && !spec.OwnSysfs {
		// A sandbox with a prepared namespace, or one that will be given
		// devices, mounts its own sysfs, which shows them.
		p, err := r.sysfs.path()
		if err != nil {
			return nil, err
		}
		c.Add(shim.TSysfs, p)
	}
	c.AddInt(shim.TTmpSize, r.tmpSize)
	c.AddInt(shim.TShmSize, r.shmSize)
	c.Add(shim.TCaps, strconv.FormatUint(r.caps, 10))
	if len(filter) > 0 {
		c.AddBytes(shim.TSeccomp, filter)
	}

	flags := uintptr(unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC)
	if spec.NetNSPath == "" {
		flags |= unix.CLONE_NEWNET
	}
	p, status, err := r.startShim(ctx, shim.ModeInit, c.Bytes(), flags, nil, -1)
	if err != nil {
		return nil, err
	}
	sb.init = p.proc
	// The init waits on the sync pipe until it is in its cgroup, so that
	// everything it mounts and forks is charged there.
	if err := sb.group.AddProc(p.proc.pid); err != nil {
		p.abort()
		return nil, fmt.Errorf("add init to cgroup: %w", err)
	}
	if _, err := p.sync.Write([]byte{1}); err != nil {
		p.abort()
		return nil, fmt.Errorf("release init: %w", err)
	}
	p.sync.Close()
	if _, err := readStatus(ctx, status); err != nil {
		return nil, fmt.Errorf("start sandbox init: %w", err)
	}
	if err := layout.Release(); err != nil {
		return nil, err
	}
	if sb.start, err = procStartTime(sb.init.pid); err != nil {
		return nil, fmt.Errorf("read init start time: %w", err)
	}
	if sb.disk {
		sb.upper = fmt.Sprintf("/proc/%d/fd/%d/%s", sb.init.pid, shim.FdConfig, rootfs.UpperName)
	}
	return sb.state(r.cgroupParent), nil
}

// undoCreate removes what a failed Create made, in reverse order.
func (r *NamespaceRuntime) undoCreate(sb *sandbox, layout *rootfs.Layout) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if sb.init != nil {
		_ = sb.init.signal(unix.SIGKILL)
		_ = sb.init.wait(ctx)
		sb.init.reap()
		_ = sb.init.close()
	}
	if layout != nil {
		_ = layout.Release()
	}
	if sb.group != nil {
		_ = sb.group.Kill(ctx)
		if err := sb.group.Delete(ctx); err != nil {
			r.log.Warn("failed create: cgroup left behind", "id", sb.id, "err", err)
		}
	}
	if layout != nil {
		if err := rootfs.Remove(sb.dir); err != nil {
			r.log.Warn("failed create: dir left behind", "id", sb.id, "err", err)
		}
	}
}

func (sb *sandbox) state(parent string) *State {
	env, _ := json.Marshal(sb.env)
	st := &State{ID: sb.id, Pid: sb.init.pid, PidStart: sb.start, Dir: sb.dir, Cgroup: parent + "/" + sb.id,
		Paused: sb.paused, CreatedAt: sb.createdAt, Extra: map[string]string{"env": string(env)}}
	if sb.group != nil {
		st.Cgroup = sb.group.Name()
	}
	if sb.disk {
		st.Extra["disk"] = "1"
	}
	if sb.netns != "" {
		st.Extra["netns"] = sb.netns
	}
	if sb.userns {
		st.Extra["allow_userns"] = "1"
	}
	return st
}

// started is a shim process between start and its status line.
type started struct {
	proc *proc
	sync *os.File // init only: write end of the sync pipe
}

func (s *started) abort() {
	_ = s.proc.signal(unix.SIGKILL)
	if s.sync != nil {
		s.sync.Close()
	}
}

// startShim starts a shim in mode with config on fd 3 and returns the read
// end of its status pipe. stdio nil = /dev/null for all three. In exec mode
// aux (the init's pidfd) becomes fd 5; in init mode a sync pipe does. The
// shim is a fork of the spawner, or, without one, an exec of the shim
// binary.
func (r *NamespaceRuntime) startShim(ctx context.Context, mode string, config []byte, cloneflags uintptr,
	stdio []int, aux int) (*started, *os.File, error) {
	cfgR, cfgW, err := pipe()
	if err != nil {
		return nil, nil, err
	}
	defer unix.Close(cfgR)
	// The whole config sits in the pipe before the shim starts: no round
	// trip, and no goroutine.
	if len(config) > 65536 {
		if _, err := unix.FcntlInt(uintptr(cfgW), unix.F_SETPIPE_SZ, len(config)); err != nil {
			unix.Close(cfgW)
			return nil, nil, fmt.Errorf("config of %d bytes too large: %w", len(config), errdefs.ErrInvalidArgument)
		}
	}
	_, err = unix.Write(cfgW, config)
	unix.Close(cfgW)
	if err != nil {
		return nil, nil, err
	}
	stR, stW, err := pipe()
	if err != nil {
		return nil, nil, err
	}
	defer unix.Close(stW)
	// Non-blocking so reads go through the poller and honour deadlines.
	_ = unix.SetNonblock(stR, true)
	status := os.NewFile(uintptr(stR), "shim-status")
	s := &started{}
	if mode == shim.ModeInit {
		syncR, syncW, err := pipe()
		if err != nil {
			status.Close()
			return nil, nil, err
		}
		defer unix.Close(syncR)
		s.sync = os.NewFile(uintptr(syncW), "shim-sync")
		aux = syncR
	}
	null := int(r.null.Fd())
	if stdio == nil {
		stdio = []int{null, null, null}
	}
	files := []int{stdio[0], stdio[1], stdio[2], cfgR, stW}
	if aux >= 0 {
		files = append(files, aux)
	}
	pid, pidfd, err := r.spawn(ctx, mode, cloneflags, files)
	if err != nil {
		status.Close()
		if s.sync != nil {
			s.sync.Close()
		}
		return nil, nil, err
	}
	if s.proc, err = newProc(pid, pidfd); err != nil {
		status.Close()
		return nil, nil, err
	}
	return s, status, nil
}

// spawn starts the shim process through the spawner or, when there is
// none, by fork and exec of the shim binary.
func (r *NamespaceRuntime) spawn(ctx context.Context, mode string, cloneflags uintptr, files []int) (int, int, error) {
	m := uint32(shim.SpawnExec)
	if mode == shim.ModeInit {
		m = shim.SpawnInit
	}
	pid, pidfd, err := r.spawner.spawn(ctx, m, cloneflags, files)
	if !errors.Is(err, errNoSpawner) {
		if err != nil {
			return -1, -1, fmt.Errorf("start shim: %w", err)
		}
		return pid, pidfd, nil
	}
	fds := make([]uintptr, len(files))
	for i, fd := range files {
		fds[i] = uintptr(fd)
	}
	pidfd = -1
	pid, err = syscall.ForkExec(r.shimPath, []string{mode}, &syscall.ProcAttr{
		Env:   []string{shim.EnvVar + "=" + mode},
		Files: fds,
		Sys: &syscall.SysProcAttr{
			Cloneflags: cloneflags,
			// Own session: a signal to the server's process group (e.g.
			// ^C) must not reach sandboxes. No Pdeathsig: they outlive the
			// server.
			Setsid: true,
			PidFD:  &pidfd,
		},
	})
	if err != nil {
		return -1, -1, fmt.Errorf("start shim: %w", err)
	}
	return pid, pidfd, nil
}

func pipe() (int, int, error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return -1, -1, err
	}
	return p[0], p[1], nil
}

// readStatus reads the shim's status line, bounded by ctx.
func readStatus(ctx context.Context, f *os.File) (string, error) {
	defer f.Close()
	stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(aLongTimeAgo) })
	defer stop()
	v, err := shim.ReadStatus(f)
	if err != nil && ctx.Err() != nil {
		return "", ctx.Err()
	}
	return v, err
}

// Pause freezes every process of the sandbox.
func (r *NamespaceRuntime) Pause(ctx context.Context, id string) error {
	sb, err := r.get(id)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if err := sb.group.Freeze(ctx); err != nil {
		return err
	}
	sb.paused = true
	return nil
}

// Resume thaws a paused sandbox.
func (r *NamespaceRuntime) Resume(ctx context.Context, id string) error {
	sb, err := r.get(id)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if err := sb.group.Thaw(ctx); err != nil {
		return err
	}
	sb.paused = false
	return nil
}

// Destroy kills the sandbox and removes its cgroup and directory. Its
// mounts live only in its mount namespace and vanish with its last process;
// a disk's loop device detaches itself then (autoclear).
func (r *NamespaceRuntime) Destroy(ctx context.Context, id string) error {
	if err := validateID(id); err != nil {
		return err
	}
	sb, err := r.get(id)
	if err != nil {
		return nil
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.gone {
		return nil
	}
	// Killing PID 1 makes the kernel kill the whole pid namespace.
	_ = sb.init.signal(unix.SIGKILL)
	if sb.paused {
		// Frozen tasks do not die until thawed.
		if err := sb.group.Thaw(ctx); err != nil {
			return err
		}
	}
	if err := sb.init.wait(ctx); err != nil {
		return fmt.Errorf("wait for init: %w", err)
	}
	sb.init.reap()
	// Exec shims live outside the pid namespace but in the cgroup.
	if procs, err := sb.group.Procs(); err != nil || len(procs) > 0 {
		if err := sb.group.Kill(ctx); err != nil {
			return fmt.Errorf("kill cgroup: %w", err)
		}
	}
	if err := sb.group.Delete(ctx); err != nil {
		return fmt.Errorf("delete cgroup: %w", err)
	}
	if err := rootfs.Remove(sb.dir); err != nil {
		return fmt.Errorf("remove sandbox dir: %w", err)
	}
	sb.gone = true
	_ = sb.init.close()
	r.mu.Lock()
	delete(r.sbs, id)
	r.mu.Unlock()
	return nil
}

// Reap removes what a sandbox whose init is gone left behind (its cgroup,
// with any process still in it, and its directory), from the State an
// earlier server persisted. A sandbox this runtime still runs is refused.
func (r *NamespaceRuntime) Reap(ctx context.Context, st State) error {
	if err := validateID(st.ID); err != nil {
		return err
	}
	if _, err := r.get(st.ID); err == nil {
		return fmt.Errorf("sandbox %s is running; destroy it instead: %w", st.ID, errdefs.ErrFailedPrecondition)
	}
	if !filepath.IsAbs(st.Dir) || st.Cgroup == "" {
		return fmt.Errorf("sandbox %s: incomplete state: %w", st.ID, errdefs.ErrInvalidArgument)
	}
	if g, err := r.cg.Load(ctx, st.Cgroup); err == nil {
		// A frozen group must thaw for its processes to die.
		_ = g.Thaw(ctx)
		if procs, err := g.Procs(); err != nil || len(procs) > 0 {
			if err := g.Kill(ctx); err != nil {
				return fmt.Errorf("kill cgroup: %w", err)
			}
		}
		if err := g.Delete(ctx); err != nil {
			return fmt.Errorf("delete cgroup: %w", err)
		}
	} else if !errdefs.IsNotFound(err) {
		return err
	}
	if err := rootfs.Remove(st.Dir); err != nil {
		return fmt.Errorf("remove sandbox dir: %w", err)
	}
	return nil
}

// ReapOrphan is Reap for a sandbox known only by its id and directory (a
// create cut short before its State was recorded): its cgroup is the one
// Create names after the id.
func (r *NamespaceRuntime) ReapOrphan(ctx context.Context, id, dir string) error {
	return r.Reap(ctx, State{ID: id, Dir: dir, Cgroup: r.cgroupName(id)})
}

func (r *NamespaceRuntime) cgroupName(id string) string { return r.cgroupParent + "/" + id }

// Adopt takes over a sandbox from a State persisted by an earlier server.
func (r *NamespaceRuntime) Adopt(ctx context.Context, st State) error {
	if err := validateID(st.ID); err != nil {
		return err
	}
	if st.Pid <= 0 || !filepath.IsAbs(st.Dir) || st.Cgroup == "" {
		return fmt.Errorf("state of %s is incomplete: %w", st.ID, errdefs.ErrInvalidArgument)
	}
	r.mu.Lock()
	exists := r.sbs[st.ID] != nil || r.creating[st.ID]
	r.mu.Unlock()
	if exists {
		return fmt.Errorf("sandbox %s: %w", st.ID, errdefs.ErrAlreadyExists)
	}
	p, err := openProc(st.Pid, st.PidStart)
	if err != nil {
		return fmt.Errorf("sandbox %s init (pid %d) is gone: %v: %w", st.ID, st.Pid, err, errdefs.ErrNotFound)
	}
	g, err := r.cg.Load(ctx, st.Cgroup)
	if err != nil {
		_ = p.close()
		return fmt.Errorf("sandbox %s cgroup %s: %w", st.ID, st.Cgroup, errors.Join(errdefs.ErrNotFound, err))
	}
	sb := &sandbox{id: st.ID, dir: st.Dir, init: p, start: st.PidStart, group: g, paused: st.Paused,
		createdAt: st.CreatedAt, netns: st.Extra["netns"], userns: st.Extra["allow_userns"] == "1",
		disk: st.Extra["disk"] == "1"}
	if e := st.Extra["env"]; e != "" {
		if err := json.Unmarshal([]byte(e), &sb.env); err != nil {
			_ = p.close()
			return fmt.Errorf("state env: %w", errors.Join(errdefs.ErrInvalidArgument, err))
		}
	}
	if sb.filter, err = r.filterFor(Spec{ID: st.ID, Dir: st.Dir, Env: sb.env, NetNSPath: sb.netns, AllowUserNS: sb.userns}); err != nil {
		_ = p.close()
		return err
	}
	if sb.disk {
		sb.upper = fmt.Sprintf("/proc/%d/fd/%d/%s", st.Pid, shim.FdConfig, rootfs.UpperName)
	} else {
		sb.upper = filepath.Join(st.Dir, rootfs.UpperName)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sbs[st.ID] != nil || r.creating[st.ID] {
		_ = p.close()
		return fmt.Errorf("sandbox %s: %w", st.ID, errdefs.ErrAlreadyExists)
	}
	r.sbs[st.ID] = sb
	return nil
}

// RootFS is /proc/<init>/root.
func (r *NamespaceRuntime) RootFS(id string) (string, error) {
	sb, err := r.get(id)
	if err != nil {
		return "", err
	}
	return "/proc/" + strconv.Itoa(sb.init.pid) + "/root", nil
}

// UpperDir is the private writable layer. With a disk limit it is reached
// through a descriptor the init keeps (the disk is mounted only inside the
// sandbox), so the path is valid only while the init runs.
func (r *NamespaceRuntime) UpperDir(id string) (string, error) {
	sb, err := r.get(id)
	if err != nil {
		return "", err
	}
	return sb.upper, nil
}

// DiskUsage is the space the sandbox's private layer holds: its subvolume's
// quota count when it has one, else the allocated size of its upper dir's
// files (a walk).
func (r *NamespaceRuntime) DiskUsage(id string) (int64, error) {
	sb, err := r.get(id)
	if err != nil {
		return 0, err
	}
	if r.subvols != nil {
		if n, err := r.subvols.Usage(filepath.Join(sb.dir, rootfs.PrivateName)); err == nil {
			return n, nil
		}
	}
	return rootfs.TreeUsage(sb.upper), nil
}

// Stats are the sandbox cgroup's.
func (r *NamespaceRuntime) Stats(id string) (*cgroups.Stats, error) {
	sb, err := r.get(id)
	if err != nil {
		return nil, err
	}
	return sb.group.Stats()
}

// CPUUsage returns the sandbox's cumulative CPU time, reading only that.
func (r *NamespaceRuntime) CPUUsage(id string) (uint64, error) {
	sb, err := r.get(id)
	if err != nil {
		return 0, err
	}
	if u, ok := sb.group.(cgroups.CPUUsager); ok {
		return u.CPUUsage()
	}
	st, err := sb.group.Stats()
	if err != nil {
		return 0, err
	}
	return st.CPUUsageNanos, nil
}

// Alive reports whether the sandbox's init still runs.
func (r *NamespaceRuntime) Alive(id string) bool {
	sb, err := r.get(id)
	if err != nil {
		return false
	}
	return !sb.init.exited()
}

// Pid returns the host pid of the sandbox's init.
func (r *NamespaceRuntime) Pid(id string) (int, error) {
	sb, err := r.get(id)
	if err != nil {
		return 0, err
	}
	return sb.init.pid, nil
}
