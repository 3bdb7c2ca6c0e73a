package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/reclaim"
	"github.com/dsec-dev/dsec/internal/rootfs"
	"github.com/dsec-dev/dsec/internal/runtime"
)

// Config configures a Local agent.
type Config struct {
	Name    string
	DataDir string // the agent keeps sandboxes/ and meta/ below it
	// SandboxesDir holds the sandbox dirs instead of DataDir/sandboxes
	// (e.g. the root of the node's btrfs subvolumes).
	SandboxesDir string

	DefaultCPU         float64
	DefaultMemoryBytes int64
	DefaultPids        int64
	DefaultDiskBytes   int64
	DefaultEnv         []string

	// TaskSchedIdle: the cpu controller has no cpu.idle (v1 before 5.15),
	// so batch sandboxes' tasks are made SCHED_IDLE one by one instead.
	TaskSchedIdle bool
	// Features are reported as is in NodeInfo.Features (what the node
	// detected: swap tier, DAMON, reclaim settings).
	Features map[string]string

	// Execs bounds what each sandbox keeps of its ended execs.
	Execs ExecRetention
}

// Deps are the mechanisms the agent drives. Network and Admission may be nil.
type Deps struct {
	Runtime   runtime.Runtime
	Images    ImageResolver
	Layers    LayerProvider
	Committer LayerCommitter
	Network   Network
	Files     FileRootOpener
	Admission Admission
	Stats     *StatsSampler
	// Orphans removes what the runtime left of a sandbox without a
	// record; nil leaves such directories alone.
	Orphans OrphanReaper
}

// Local is the Agent of the host it runs on.
type Local struct {
	cfg  Config
	deps Deps
	log  *slog.Logger

	mu  sync.RWMutex
	sbs map[string]*sandbox

	forkMu sync.Mutex
	forks  map[string]forkImage // (source/group) -> pinned fork image
}

var _ Agent = (*Local)(nil)

type sandbox struct {
	mu       sync.Mutex
	rec      Sandbox
	releases []func()
	attached bool
	execs    map[string]*execEntry // of this server process
	history  execHistory
	// resident is rec's resource view as last persisted, readable
	// without mu (which a create or snapshot holds for long).
	resident atomic.Pointer[Resident]
}

// Resident is what node-level policy (admission, CPU sampling) needs of a
// sandbox.
type Resident struct {
	ID    string
	State string
	CPU   float64 // requested cores
	QoS   string
	// Cgroup is the runtime's cgroup of the sandbox ("" until created).
	Cgroup string
}

// Residents lists the node's sandboxes as last recorded, without waiting
// for those in the middle of a create, delete or snapshot, so admitting
// one sandbox does not queue behind the creates in flight.
func (l *Local) Residents() []Resident {
	l.mu.RLock()
	out := make([]Resident, 0, len(l.sbs))
	l.mu.RUnlock()
	l.EachResident(func(r Resident) { out = append(out, r) })
	return out
}

// EachResident calls fn with what Residents would list, one sandbox at a
// time, without building the list: admission reads every sandbox on each
// create. fn runs under the agent's lock and must not call the agent.
func (l *Local) EachResident(fn func(Resident)) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	for id, sb := range l.sbs {
		fn(sb.view(id))
	}
}

// Resident is what EachResident would give for one sandbox: admission
// looks up the few sandboxes it admitted, not every one.
func (l *Local) Resident(id string) (Resident, bool) {
	l.mu.RLock()
	sb := l.sbs[id]
	l.mu.RUnlock()
	if sb == nil {
		return Resident{}, false
	}
	return sb.view(id), true
}

// view is the sandbox's resource view without waiting for sb.mu: as last
// published, or as "creating" while a create or delete holds it.
func (sb *sandbox) view(id string) Resident {
	if r := sb.resident.Load(); r != nil {
		return *r
	}
	if sb.mu.TryLock() { // a record adopted as dead and never persisted since
		defer sb.mu.Unlock()
		return sb.residentView()
	}
	return Resident{ID: id, State: StateCreating}
}

type execEntry struct {
	info ExecInfo
	exec runtime.Exec
	done chan struct{}
}

// NewLocal returns an agent and adopts the sandboxes an earlier process left
// running. Sandboxes whose processes died meanwhile are kept as StateDead.
func NewLocal(ctx context.Context, cfg Config, deps Deps, log *slog.Logger) (*Local, error) {
	if deps.Runtime == nil || deps.Images == nil || deps.Layers == nil || deps.Files == nil {
		return nil, fmt.Errorf("node: runtime, images, layers and files are required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Name == "" {
		h, _ := os.Hostname()
		cfg.Name = h
	}
	if log == nil {
		log = slog.Default()
	}
	if err := cfg.Execs.setDefaults(); err != nil {
		return nil, err
	}
	l := &Local{cfg: cfg, deps: deps, log: log, sbs: map[string]*sandbox{}}
	for _, d := range []string{l.metaDir(), l.sandboxesDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("node: %w", err)
		}
	}
	if err := l.recover(ctx); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Local) metaDir() string { return filepath.Join(l.cfg.DataDir, "meta") }
func (l *Local) sandboxesDir() string {
	if l.cfg.SandboxesDir != "" {
		return l.cfg.SandboxesDir
	}
	return filepath.Join(l.cfg.DataDir, "sandboxes")
}
func (l *Local) metaPath(id string) string {
	return filepath.Join(l.metaDir(), id+".json")
}

// recover adopts every sandbox recorded on disk.
func (l *Local) recover(ctx context.Context) error {
	ents, err := os.ReadDir(l.metaDir())
	if err != nil {
		return fmt.Errorf("node: recover: %w", err)
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(l.metaDir(), e.Name()))
		if err != nil {
			return fmt.Errorf("node: recover %s: %w", e.Name(), err)
		}
		var rec Sandbox
		if err := json.Unmarshal(b, &rec); err != nil {
			l.log.Error("node: unreadable sandbox record kept aside", "file", e.Name(), "err", err)
			continue
		}
		sb := &sandbox{rec: rec, execs: map[string]*execEntry{}}
		if rec.State == StateCreating || rec.State == StateDeleted {
			// A create or delete interrupted by a crash: finish the delete.
			l.sbs[rec.ID] = sb
			_ = l.destroy(ctx, sb)
			continue
		}
		if rec.State != StateDead {
			if err := l.deps.Runtime.Adopt(ctx, rec.Runtime); err != nil {
				l.log.Warn("node: sandbox died while no server ran", "id", rec.ID, "err", err)
				sb.rec.State = StateDead
				sb.rec.Reason = "processes ended while the server was down: " + err.Error()
			} else {
				// Hold the layers again so they stay mounted for it.
				if _, err := l.acquireLayers(ctx, sb); err != nil {
					l.log.Error("node: re-acquire layers", "id", rec.ID, "err", err)
				}
				sb.attached = len(rec.Spec.Network.Allow) > 0
				if sb.attached && l.deps.Network != nil {
					if err := l.deps.Network.Attach(ctx, rec.ID, rec.Runtime.Pid, rec.Spec.Network); err != nil {
						l.log.Error("node: re-attach network", "id", rec.ID, "err", err)
					}
				}
			}
		}
		// Rewrite the record only when adoption changed it: thousands of
		// sandboxes make a restart slow enough as it is.
		if sb.rec.State != rec.State || sb.rec.ImagePinned != rec.ImagePinned {
			_ = l.persist(sb)
		} else {
			sb.publish()
		}
		l.sbs[rec.ID] = sb
		l.log.Info("node: adopted sandbox", "id", rec.ID, "state", sb.rec.State)
	}
	l.reapOrphans(ctx)
	l.sweepExecRecords(ents)
	live := make([]string, 0, len(l.sbs))
	for id, sb := range l.sbs {
		if sb.rec.State == StateRunning || sb.rec.State == StatePaused {
			live = append(live, id)
		}
	}
	if err := l.deps.Layers.Sync(ctx, live); err != nil {
		l.log.Warn("node: sync layer leases", "err", err)
	}
	return nil
}

// sweepExecRecords removes the exec records of sandboxes the node no
// longer has: a delete cut short, or servers before 2026-11-30, whose
// deletes left them behind.
// ents is recover's listing of the records' directory.
func (l *Local) sweepExecRecords(ents []os.DirEntry) {
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".execs")
		if !ok || !l.recordless(id) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(l.metaDir(), e.Name())); err != nil {
			l.log.Warn("node: remove exec records of a deleted sandbox", "id", id, "err", err)
			continue
		}
		l.log.Info("node: removed exec records of a deleted sandbox", "id", id)
	}
}

// recordless reports whether id names no sandbox of the node, not even
// one whose record was unreadable (kept aside with what it has). Only
// during recover, before anything else can create a sandbox.
func (l *Local) recordless(id string) bool {
	if !validID(id) || l.sbs[id] != nil {
		return false
	}
	_, err := os.Lstat(l.metaPath(id))
	return err != nil
}

// reapOrphans removes the sandboxes whose directory exists without a
// record: a create cut short between the runtime's work and the record's
// write, or a delete after it removed the record. Their processes,
// cgroups and directories would otherwise outlive every server unseen.
// Runs in recover, after every record was adopted, before anything else
// can create a sandbox.
func (l *Local) reapOrphans(ctx context.Context) {
	if l.deps.Orphans == nil {
		return
	}
	ents, err := os.ReadDir(l.sandboxesDir())
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			l.log.Warn("node: list sandbox directories", "err", err)
		}
		return
	}
	for _, e := range ents {
		id := e.Name()
		if !e.IsDir() || !l.recordless(id) {
			continue
		}
		dir := filepath.Join(l.sandboxesDir(), id)
		if err := l.deps.Orphans.ReapOrphan(ctx, id, dir); err != nil {
			l.log.Error("node: removing a sandbox without a record", "id", id, "dir", dir, "err", err)
			continue
		}
		l.log.Warn("node: removed a sandbox without a record (a create or delete cut short)", "id", id)
	}
}

// publish updates the lock-free view Residents reads. sb.mu held.
func (sb *sandbox) publish() {
	r := sb.residentView()
	sb.resident.Store(&r)
}

// residentView is rec's resource view. sb.mu held.
func (sb *sandbox) residentView() Resident {
	return Resident{ID: sb.rec.ID, State: sb.rec.State, CPU: sb.rec.Spec.CPU, QoS: sb.rec.Spec.QoS, Cgroup: sb.rec.Runtime.Cgroup}
}

func (l *Local) persist(sb *sandbox) error {
	sb.publish()
	if l.deps.Stats != nil && sb.rec.State != StateRunning && sb.rec.State != StatePaused {
		// Out of admission's sums the moment it is found dead.
		l.deps.Stats.Forget(sb.rec.ID)
	}
	b, err := json.Marshal(&sb.rec)
	if err != nil {
		return err
	}
	p := l.metaPath(sb.rec.ID)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("node: persist %s: %w", sb.rec.ID, err)
	}
	return os.Rename(tmp, p)
}

// NewID returns a fresh sandbox id.
func NewID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "sb-" + hex.EncodeToString(b[:])
}

func validID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func (l *Local) get(id string) (*sandbox, error) {
	l.mu.RLock()
	sb := l.sbs[id]
	l.mu.RUnlock()
	if sb == nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

// resources turns a spec into cgroup settings. The QoS class sets the CPU
// weight (and cpu.idle for batch) through reclaim.ApplyClass, the one
// mapping of classes; the CPU request scales the weight, so two standard
// sandboxes share in proportion to what they asked for. taskSchedIdle
// (v1 without cpu.idle) leaves cpu.idle off: the agent makes batch tasks
// SCHED_IDLE instead.
func resources(spec SandboxSpec, taskSchedIdle bool) (cgroups.Resources, error) {
	// Swap is bounded by the memory limit: proactive reclaim may push all
	// of a sandbox's memory out, but with swap on the host a memory bomb
	// must still be killed (at twice its limit), not fill the host's swap.
	swap := int64(-1)
	if spec.MemoryBytes > 0 {
		swap = spec.MemoryBytes
	}
	r, err := reclaim.ApplyClass(spec.QoS, cgroups.Resources{
		MemoryLimit: spec.MemoryBytes,
		PidsLimit:   spec.Pids,
		SwapLimit:   swap,
	})
	if err != nil {
		return r, err
	}
	if r.CPUWeight > 0 {
		w := uint64(float64(r.CPUWeight) * max(spec.CPU, 0.01))
		r.CPUWeight = min(max(w, 1), 10000)
	}
	if r.CPUIdle && taskSchedIdle {
		r.CPUIdle, r.CPUWeight = false, 1
	}
	if spec.CPULimit > 0 {
		r.CPUPeriodMicros = 100000
		r.CPUQuotaMicros = int64(spec.CPULimit * 100000)
	}
	return r, nil
}

func (l *Local) applyDefaults(spec *SandboxSpec) error {
	if spec.ID == "" {
		spec.ID = NewID()
	}
	if !validID(spec.ID) {
		return fmt.Errorf("sandbox id %q: only a-z, 0-9, - and _ (at most 64): %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	if spec.Image == "" && spec.FromSandbox == "" {
		return fmt.Errorf("an image is required: %w", errdefs.ErrInvalidArgument)
	}
	if spec.CPU < 0 || spec.CPULimit < 0 || spec.MemoryBytes < 0 || spec.Pids < 0 || spec.DiskBytes < 0 {
		return fmt.Errorf("resources must not be negative: %w", errdefs.ErrInvalidArgument)
	}
	if spec.CPU == 0 {
		spec.CPU = l.cfg.DefaultCPU
	}
	if spec.MemoryBytes == 0 {
		spec.MemoryBytes = l.cfg.DefaultMemoryBytes
	}
	if spec.Pids == 0 {
		spec.Pids = l.cfg.DefaultPids
	}
	if spec.DiskBytes == 0 {
		spec.DiskBytes = l.cfg.DefaultDiskBytes
	}
	switch spec.QoS {
	case "":
		spec.QoS = QoSStandard
	case QoSLatency, QoSStandard, QoSBatch:
	default:
		return fmt.Errorf("qos %q: want latency, standard or batch: %w", spec.QoS, errdefs.ErrInvalidArgument)
	}
	switch spec.OnIdle {
	case "":
		spec.OnIdle = "delete"
	case "delete", "pause":
	default:
		return fmt.Errorf("on_idle %q: want delete or pause: %w", spec.OnIdle, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Name is the node's name (Info also measures every sandbox).
func (l *Local) Name() string { return l.cfg.Name }

// Info implements Agent.
func (l *Local) Info(ctx context.Context) (*NodeInfo, error) {
	info := &NodeInfo{Name: l.cfg.Name, CPUs: numCPU(), Features: map[string]string{}}
	for k, v := range l.cfg.Features {
		info.Features[k] = v
	}
	if mem, err := reclaim.ReadNode("/proc/meminfo"); err == nil {
		info.MemoryBytes = mem.Total
		info.MemAvailable = mem.Available
	}
	l.mu.RLock()
	sbs := make([]*sandbox, 0, len(l.sbs))
	for _, sb := range l.sbs {
		sbs = append(sbs, sb)
	}
	l.mu.RUnlock()
	for _, sb := range sbs {
		sb.mu.Lock()
		st, spec := sb.rec.State, sb.rec.Spec
		sb.mu.Unlock()
		if st != StateRunning && st != StatePaused {
			continue
		}
		info.Sandboxes++
		info.CPURequested += spec.CPU
		if s, err := l.stats(spec.ID, st, spec, false); err == nil {
			info.CPUUsed += s.CPUUsed
			info.MemoryHeldBytes += s.MemoryHeldBytes
			info.MemoryReclaimableBytes += s.MemoryReclaimableBytes
		}
	}
	if l.deps.Stats != nil {
		info.CgroupVersion = l.deps.Stats.CgroupVersion
	}
	info.SchedCore = reclaim.SchedCoreAvailable()
	info.Features["sched_core"] = fmt.Sprint(info.SchedCore)
	return info, nil
}

// Capacity implements Agent.
func (l *Local) Capacity(ctx context.Context, shape SandboxSpec) (*Capacity, error) {
	if l.deps.Admission == nil {
		return nil, fmt.Errorf("capacity: no admission policy configured: %w", errdefs.ErrNotImplemented)
	}
	if err := l.applyDefaults(&shape); err != nil && !errdefs.IsInvalidArgument(err) {
		return nil, err
	}
	return l.deps.Admission.Capacity(ctx, shape)
}

// CreateSandbox implements Agent. It returns once the sandbox's init runs.
func (l *Local) CreateSandbox(ctx context.Context, spec SandboxSpec) (*Sandbox, error) {
	if spec.Image == "" && spec.FromSandbox != "" {
		spec.Image = "-" // resolved from the fork's snapshot below
	}
	if err := l.applyDefaults(&spec); err != nil {
		return nil, err
	}
	if spec.FromSandbox != "" {
		ref, err := l.forkImage(ctx, spec.FromSandbox, spec.ForkGroup)
		if err != nil {
			return nil, err
		}
		spec.Image = ref
	}
	if l.deps.Admission != nil {
		if err := l.deps.Admission.Admit(ctx, spec); err != nil {
			return nil, err
		}
	}
	now := time.Now()
	sb := &sandbox{
		rec: Sandbox{
			Spec: spec, ID: spec.ID, Node: l.cfg.Name, State: StateCreating,
			CreatedAt: now, LastActivity: now,
		},
		execs: map[string]*execEntry{},
	}
	l.mu.Lock()
	if _, ok := l.sbs[spec.ID]; ok {
		l.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, errdefs.ErrAlreadyExists)
	}
	l.sbs[spec.ID] = sb
	l.mu.Unlock()

	sb.mu.Lock()
	defer sb.mu.Unlock()
	if err := l.create(ctx, sb); err != nil {
		_ = l.destroy(context.WithoutCancel(ctx), sb)
		return nil, err
	}
	rec := sb.rec
	return &rec, nil
}

func (l *Local) acquireLayers(ctx context.Context, sb *sandbox) ([]string, error) {
	ref := sb.rec.Spec.Image
	if sb.rec.ImagePinned != "" {
		ref = sb.rec.ImagePinned
	}
	pinned, layers, err := l.deps.Images.ResolveImage(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", sb.rec.Spec.Image, err)
	}
	sb.rec.ImagePinned = pinned
	lower := make([]string, len(layers))
	id := sb.rec.ID
	for i, ly := range layers {
		p, err := l.deps.Layers.Acquire(ctx, ly, id)
		if err != nil {
			return nil, fmt.Errorf("image %s: layer %s: %w", sb.rec.Spec.Image, ly, err)
		}
		sb.releases = append(sb.releases, func() {
			if err := l.deps.Layers.Release(context.Background(), ly, id); err != nil {
				l.log.Warn("node: release layer", "sandbox", id, "layer", ly, "err", err)
			}
		})
		// overlayfs wants the top-most layer first.
		lower[len(layers)-1-i] = p
	}
	return lower, nil
}

// create runs with sb.mu held. The sandbox's record is written once, when
// it runs: a crash before that leaves a sandbox directory without a record,
// which the next start removes (reapOrphans).
func (l *Local) create(ctx context.Context, sb *sandbox) error {
	sb.publish()
	spec := sb.rec.Spec
	lower, err := l.acquireLayers(ctx, sb)
	if err != nil {
		return err
	}
	env := append(append([]string{}, l.cfg.DefaultEnv...), spec.Env...)
	res, err := resources(spec, l.cfg.TaskSchedIdle)
	if err != nil {
		return err
	}
	st, err := l.deps.Runtime.Create(ctx, runtime.Spec{
		ID:          spec.ID,
		Hostname:    spec.ID,
		Dir:         filepath.Join(l.sandboxesDir(), spec.ID),
		Lower:       lower,
		Env:         env,
		Resources:   res,
		DiskBytes:   spec.DiskBytes,
		AllowUserNS: spec.AllowUserNS,
		// Its link to the host is added below; /sys must show it.
		OwnSysfs: len(spec.Network.Allow) > 0,
	})
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}
	sb.rec.Runtime = *st
	if spec.QoS == QoSBatch && l.cfg.TaskSchedIdle {
		// The init's children inherit the policy; execs are caught by
		// the efficiency loop's sweep.
		if err := reclaim.SetSchedIdle(st.Pid, true); err != nil {
			return fmt.Errorf("sandbox %s: batch class: %w", spec.ID, err)
		}
	}
	if len(spec.Network.Allow) > 0 {
		if l.deps.Network == nil {
			return fmt.Errorf("sandbox %s asks for egress but this node has no network policy support: %w", spec.ID, errdefs.ErrFailedPrecondition)
		}
		if err := l.deps.Network.Attach(ctx, spec.ID, st.Pid, spec.Network); err != nil {
			return fmt.Errorf("sandbox %s: network: %w", spec.ID, err)
		}
		sb.attached = true
	}
	sb.rec.State = StateRunning
	return l.persist(sb)
}

// destroy runs with sb.mu held (or on a sandbox nobody else can see yet).
// The record goes first: should the server stop half-way, the next start
// finds the sandbox's directory without a record and finishes the removal
// (reapOrphans).
func (l *Local) destroy(ctx context.Context, sb *sandbox) error {
	id := sb.rec.ID
	sb.rec.State = StateDeleted
	sb.publish()
	if l.deps.Stats != nil {
		l.deps.Stats.Forget(id) // out of admission's sums as its delete begins
	}
	if err := os.Remove(l.metaPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		// Deleting goes on: a record left behind is adopted as dead
		// after a restart, visible and deletable.
		l.log.Warn("node: remove sandbox record", "id", id, "err", err)
	}
	// Its exec records go with it (the control plane keeps the results);
	// a crash before this leaves them to the sweep at the next start.
	if err := os.RemoveAll(l.execDir(id)); err != nil {
		l.log.Warn("node: remove exec records", "id", id, "err", err)
	}
	for _, e := range sb.execs {
		if e.exec != nil {
			_ = e.exec.Signal(syscall.SIGKILL)
		}
	}
	var errs []error
	if sb.attached && l.deps.Network != nil {
		if err := l.deps.Network.Detach(ctx, id); err != nil {
			errs = append(errs, err)
		}
		sb.attached = false
	}
	if err := l.deps.Runtime.Destroy(ctx, id); err != nil {
		errs = append(errs, err)
	}
	if r, ok := l.deps.Runtime.(runtimeReaper); ok && sb.rec.Runtime.Cgroup != "" && !l.deps.Runtime.Alive(id) {
		// A sandbox that died while no server ran is unknown to this
		// runtime: remove what it left (cgroup, directory) from its record.
		if err := r.Reap(ctx, sb.rec.Runtime); err != nil && !errdefs.IsFailedPrecondition(err) {
			errs = append(errs, err)
		}
	}
	for _, r := range sb.releases {
		r()
	}
	sb.releases = nil
	if l.deps.Stats != nil {
		l.deps.Stats.Forget(id)
	}
	if len(errs) == 0 {
		l.mu.Lock()
		delete(l.sbs, id)
		l.mu.Unlock()
	}
	return errors.Join(errs...)
}

// GetSandbox implements Agent.
func (l *Local) GetSandbox(ctx context.Context, id string) (*Sandbox, error) {
	sb, err := l.get(id)
	if err != nil {
		return nil, err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	l.checkAlive(sb)
	rec := sb.rec
	return &rec, nil
}

// checkAlive marks a sandbox whose init vanished as dead. sb.mu held.
func (l *Local) checkAlive(sb *sandbox) {
	if sb.rec.State != StateRunning && sb.rec.State != StatePaused {
		return
	}
	if !l.deps.Runtime.Alive(sb.rec.ID) {
		sb.rec.State = StateDead
		sb.rec.Reason = "sandbox init exited"
		_ = l.persist(sb)
	}
}

// ListSandboxes implements Agent.
func (l *Local) ListSandboxes(ctx context.Context) ([]Sandbox, error) {
	l.mu.RLock()
	sbs := make([]*sandbox, 0, len(l.sbs))
	for _, sb := range l.sbs {
		sbs = append(sbs, sb)
	}
	l.mu.RUnlock()
	out := make([]Sandbox, 0, len(sbs))
	for _, sb := range sbs {
		sb.mu.Lock()
		l.checkAlive(sb)
		if sb.rec.State != StateDeleted {
			out = append(out, sb.rec)
		}
		sb.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

// PauseSandbox implements Agent.
func (l *Local) PauseSandbox(ctx context.Context, id string) error {
	return l.transition(ctx, id, StateRunning, StatePaused, l.deps.Runtime.Pause)
}

// ResumeSandbox implements Agent.
func (l *Local) ResumeSandbox(ctx context.Context, id string) error {
	return l.transition(ctx, id, StatePaused, StateRunning, l.deps.Runtime.Resume)
}

func (l *Local) transition(ctx context.Context, id, from, to string, fn func(context.Context, string) error) error {
	sb, err := l.get(id)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	l.checkAlive(sb)
	if sb.rec.State == to {
		return nil
	}
	if sb.rec.State != from {
		return fmt.Errorf("sandbox %s is %s, not %s: %w", id, sb.rec.State, from, errdefs.ErrFailedPrecondition)
	}
	if err := fn(ctx, id); err != nil {
		return err
	}
	sb.rec.State = to
	sb.rec.Runtime.Paused = to == StatePaused
	sb.rec.LastActivity = time.Now()
	return l.persist(sb)
}

// DeleteSandbox implements Agent.
func (l *Local) DeleteSandbox(ctx context.Context, id string) error {
	sb, err := l.get(id)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.rec.State == StatePaused {
		// A frozen cgroup cannot be emptied: thaw first; kill follows at once.
		_ = l.deps.Runtime.Resume(ctx, id)
	}
	return l.destroy(ctx, sb)
}

// SetNetwork implements Agent.
func (l *Local) SetNetwork(ctx context.Context, id string, p NetworkPolicy) error {
	sb, err := l.get(id)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.rec.State != StateRunning && sb.rec.State != StatePaused {
		return fmt.Errorf("sandbox %s is %s: %w", id, sb.rec.State, errdefs.ErrFailedPrecondition)
	}
	if l.deps.Network == nil {
		if len(p.Allow) == 0 {
			sb.rec.Spec.Network = p
			return l.persist(sb)
		}
		return fmt.Errorf("this node has no network policy support: %w", errdefs.ErrFailedPrecondition)
	}
	switch {
	case sb.attached:
		err = l.deps.Network.Update(ctx, id, p)
	case len(p.Allow) > 0:
		err = l.deps.Network.Attach(ctx, id, sb.rec.Runtime.Pid, p)
		if err == nil {
			sb.attached = true
		}
	}
	if err != nil {
		return err
	}
	sb.rec.Spec.Network = p
	return l.persist(sb)
}

// Snapshot implements Agent: the sandbox is frozen while its upper dir is
// read, so the layer is a consistent point in time.
func (l *Local) Snapshot(ctx context.Context, id, imageRef string) (string, error) {
	if l.deps.Committer == nil {
		return "", fmt.Errorf("snapshot: %w", errdefs.ErrNotImplemented)
	}
	sb, err := l.get(id)
	if err != nil {
		return "", err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.rec.State != StateRunning && sb.rec.State != StatePaused {
		return "", fmt.Errorf("sandbox %s is %s: %w", id, sb.rec.State, errdefs.ErrFailedPrecondition)
	}
	upper, err := l.deps.Runtime.UpperDir(id)
	if err != nil {
		return "", err
	}
	if sb.rec.State == StateRunning {
		if err := l.deps.Runtime.Pause(ctx, id); err != nil {
			return "", err
		}
		defer func() { _ = l.deps.Runtime.Resume(context.WithoutCancel(ctx), id) }()
	}
	base := sb.rec.ImagePinned
	if base == "" {
		base = sb.rec.Spec.Image
	}
	return l.deps.Committer.CommitUpper(ctx, base, upper, imageRef)
}

func (l *Local) untag(ctx context.Context, ref string) {
	r, ok := l.deps.Committer.(ImageRemover)
	if !ok {
		return
	}
	if err := r.Remove(ctx, ref); err != nil && !errdefs.IsNotFound(err) {
		l.log.Warn("node: removing a fork's hidden image tag", "image", ref, "err", err)
	}
}

// runtimeReaper is a runtime that can clean up after a sandbox it did not
// start and whose processes are gone.
type runtimeReaper interface {
	Reap(ctx context.Context, st runtime.State) error
}

// forkGroupTTL is how long the commit of one fork request is reused.
const forkGroupTTL = time.Minute

type forkImage struct {
	pinned  string
	expires time.Time
}

// forkImage snapshots the source into a hidden image version that the forks
// share as a read-only layer: no per-fork copy, and with a group, one
// commit for all forks of a request. Forks run on the pinned version
// (NAME@digest), which GC keeps while a fork lives, so the hidden tag is
// removed at once and never outlives the forks.
func (l *Local) forkImage(ctx context.Context, from, group string) (string, error) {
	l.forkMu.Lock()
	defer l.forkMu.Unlock()
	now := time.Now()
	for k, f := range l.forks {
		if now.After(f.expires) {
			delete(l.forks, k)
		}
	}
	key := from + "/" + group
	if f, ok := l.forks[key]; ok && group != "" {
		return f.pinned, nil
	}
	tag := "dsec-fork/" + from + ":" + fmt.Sprint(now.UnixNano())
	ref, err := l.Snapshot(ctx, from, tag)
	if err != nil {
		return "", err
	}
	pinned, _, err := l.deps.Images.ResolveImage(ctx, ref)
	if err != nil {
		return "", err
	}
	l.untag(context.WithoutCancel(ctx), ref)
	if group != "" {
		if l.forks == nil {
			l.forks = map[string]forkImage{}
		}
		l.forks[key] = forkImage{pinned: pinned, expires: now.Add(forkGroupTTL)}
	}
	return pinned, nil
}

// SandboxStats implements Agent.
func (l *Local) SandboxStats(ctx context.Context, id string) (*SandboxStats, error) {
	sb, err := l.get(id)
	if err != nil {
		return nil, err
	}
	sb.mu.Lock()
	spec, st := sb.rec.Spec, sb.rec.State
	sb.mu.Unlock()
	return l.stats(id, st, spec, true)
}

// stats reads one sandbox's figures; withDisk adds the walk of its upper
// dir, which Info skips since it runs for every sandbox.
func (l *Local) stats(id, state string, spec SandboxSpec, withDisk bool) (*SandboxStats, error) {
	out := &SandboxStats{ID: id, State: state, CPURequested: spec.CPU}
	if state != StateRunning && state != StatePaused {
		return out, nil
	}
	cs, err := l.deps.Runtime.Stats(id)
	if err != nil {
		return nil, err
	}
	if l.deps.Stats != nil {
		l.deps.Stats.Fill(id, cs, out)
	} else {
		mem, err := reclaim.ReadNode("/proc/meminfo")
		FillMemory(cs, err == nil && mem.SwapAvailable, out)
	}
	if !withDisk {
		return out, nil
	}
	if du, ok := l.deps.Runtime.(diskUsager); ok {
		if n, err := du.DiskUsage(id); err == nil {
			out.DiskUsedBytes = n
		}
	} else if dir, err := l.deps.Runtime.UpperDir(id); err == nil {
		out.DiskUsedBytes = rootfs.TreeUsage(dir)
	}
	return out, nil
}
