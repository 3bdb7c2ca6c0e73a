package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/reclaim"
	"github.com/dsec-dev/dsec/internal/runtime"
	"github.com/dsec-dev/dsec/internal/scheduler"
)

// Efficiency settings that are not flags.
const (
	// cpuWindow is the window whose p95 admission sums; sampleInterval is
	// how often the stats loop reads every sandbox's CPU counter.
	cpuWindow      = 5 * time.Minute
	sampleInterval = 5 * time.Second
	// busyCores: a sandbox using more than this is not idle, whatever the
	// API saw (a build running in the background is not waiting).
	busyCores = 0.02
	// minMeasuredForAverage measured sandboxes make the node's average a
	// newcomer's expected CPU use; minExpectedCPU floors it (cores).
	minMeasuredForAverage = 5
	minExpectedCPU        = 0.01
	// expectedPids is what admission expects a newcomer to use of its pids
	// limit: a limit is a cap, not a need, and the node's task count
	// measures the rest.
	expectedPids = 32
	// pendingTTL drops an admission whose sandbox never showed up (its
	// create failed before the agent registered it).
	pendingTTL = 30 * time.Second
	// hostMaxAge: admissions within it share one reading of the host's
	// figures. Reading /proc/meminfo costs 0.2-0.5 ms of CPU on this
	// kernel, as much as the rest of an admission. A sandbox stops
	// counting as pending when it runs, as before; what it allocated in
	// its first moments shows up in the next reading, as what it
	// allocates later does in any reading.
	hostMaxAge = 100 * time.Millisecond
)

// efficiency is the node's accounting, admission, swap tier and reclaim
// controller, wired around one node agent.
type efficiency struct {
	log   *slog.Logger
	cg    cgroups.Manager
	stats *node.StatsSampler
	adm   *admission
	zram  *reclaim.Zram
	// taskSchedIdle: no cpu.idle in the cpu hierarchy, batch tasks are
	// made SCHED_IDLE one by one.
	taskSchedIdle bool
	features      map[string]string
	idleAfter     time.Duration

	mu       sync.Mutex
	groups   map[string]cgroups.Group // sandbox id -> its cgroup
	lastBusy map[string]time.Time
	ctrl     *reclaim.Controller
}

// newEfficiency parses the efficiency flags, sets up the swap tier and
// detects what the kernel offers. Close tears the swap tier down.
func newEfficiency(ctx context.Context, o *serveOptions, cg cgroups.Manager, log *slog.Logger) (_ *efficiency, err error) {
	log = log.With("component", "efficiency")
	swap, err := reclaim.ParseSwapSpec(o.swap)
	if err != nil {
		return nil, usagef("--swap: %v", err)
	}
	if o.reclaimIdle < 0 {
		return nil, usagef("--reclaim-idle-after must not be negative")
	}
	policy := scheduler.DefaultPolicy()
	policy.CPUOvercommit = o.overcommit
	policy.ExpectedCPUFraction = o.expectedCPU
	if o.memReserve != "" {
		if policy.MemoryReserve, err = parseSize(o.memReserve); err != nil {
			return nil, usagef("--memory-reserve: %v", err)
		}
	}
	if err := policy.Validate(); err != nil {
		return nil, usagef("--cpu-overcommit: %v", err)
	}
	stats, err := node.NewStatsSampler(cg.Version(), cpuWindow, time.Second)
	if err != nil {
		return nil, err
	}
	e := &efficiency{
		log: log, cg: cg, stats: stats, idleAfter: o.reclaimIdle,
		features: map[string]string{}, groups: map[string]cgroups.Group{}, lastBusy: map[string]time.Time{},
	}
	e.adm = &admission{stats: stats, policy: policy, cpus: float64(numCPU()), diskDir: o.sandboxesDir,
		meminfo: "/proc/meminfo", pending: map[string]pendingAdmission{}}

	e.taskSchedIdle = cg.Version() == 1 && !fileExists("/sys/fs/cgroup/cpu/cpu.idle")
	if e.taskSchedIdle {
		e.features["batch_class"] = "SCHED_IDLE per task (no cpu.idle)"
	} else {
		e.features["batch_class"] = "cpu.idle"
	}
	if !reclaim.SchedCoreAvailable() {
		// Latency sandboxes still get their weight; only SMT isolation
		// from other tenants is missing.
		e.features["core_scheduling"] = "unavailable (kernel without CONFIG_SCHED_CORE)"
	} else {
		e.features["core_scheduling"] = "available (not applied)"
	}
	if d := reclaim.DetectDAMON("/sys"); d.CanStart {
		e.features["damon"] = "available, not used: " + strings.Join(d.Operations, ",")
	} else {
		// Feature values are listed comma-separated by the CLI.
		e.features["damon"] = "unavailable: " + strings.ReplaceAll(d.Reason, ",", ";")
	}
	if present, enabled := reclaim.ZswapEnabled("/sys"); present {
		e.features["zswap"] = strconv.FormatBool(enabled)
	}
	if o.reclaimIdle > 0 {
		e.features["reclaim_idle_after"] = o.reclaimIdle.String()
	} else {
		e.features["reclaim_idle_after"] = "off"
	}
	e.features["admission"] = fmt.Sprintf("measured cpu p95 <= cores x %g; memory held + reserve %d MiB", policy.CPUOvercommit, policy.MemoryReserve>>20)

	if swap.Kind == "zram" {
		z, err := reclaim.SetupZram(ctx, log, "/sys", "/dev", swap)
		if err != nil {
			return nil, fmt.Errorf("--swap %s: %w", o.swap, err)
		}
		e.zram = z
		e.features["swap"] = fmt.Sprintf("zram %s %s", z.Device, formatSize(z.Size))
		log.Info("compressed swap tier up", "device", z.Device, "size", z.Size, "algorithm", z.Algorithm)
	} else {
		e.features["swap"] = "off"
	}
	return e, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func numCPU() int {
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) == nil && set.Count() > 0 {
		return set.Count()
	}
	return 1
}

// Close tears the swap tier down. swapoff brings swapped pages of running
// sandboxes back into memory first; that can fail when memory is short,
// and then the device is left in place with an error.
func (e *efficiency) Close() error {
	if e.zram == nil {
		return nil
	}
	if err := e.zram.Close(); err != nil {
		e.log.Error("compressed swap tier left in place", "device", e.zram.Device, "err", err)
		return err
	}
	e.log.Info("compressed swap tier removed", "device", e.zram.Device)
	return nil
}

// start runs the stats loop (CPU windows for admission, idleness, the
// batch sweep) and, with --reclaim-idle-after, the reclaim controller,
// until the returned stop is called or ctx ends.
func (e *efficiency) start(ctx context.Context, agent *node.Local, rt runtime.Runtime) (stop func(), err error) {
	e.adm.mu.Lock()
	e.adm.agent = agent
	e.adm.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Every sandbox is sampled each sampleInterval; sandboxes without
		// a measured rate yet every second, so admission replaces their
		// expected use by a measurement within about two seconds.
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for tick := 0; ; tick++ {
			e.sample(ctx, agent, rt, tick)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	if e.idleAfter > 0 {
		ctrl, err := reclaim.NewController(reclaim.SourceFunc(func(ctx context.Context) ([]reclaim.Sandbox, error) {
			return e.sandboxes(ctx, agent)
		}), e.log.With("component", "reclaim"), reclaim.Config{
			IdleAfter: e.idleAfter,
			// A pass every idle-time/5 (at most Senpai's 6s) so a short
			// idle time is acted on promptly.
			Interval: min(6*time.Second, max(time.Second, e.idleAfter/5)),
			Pageout:  e.cg.Version() == 1,
			SwapAvailable: func() bool {
				return e.stats.SwapAvailable()
			},
		})
		if err != nil {
			cancel()
			return nil, err
		}
		e.mu.Lock()
		e.ctrl = ctrl
		e.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = ctrl.Run(ctx)
		}()
		e.log.Info("proactive reclaim on", "idle_after", e.idleAfter)
	}
	return func() { cancel(); wg.Wait() }, nil
}

// cpuUsager is a runtime that can read a sandbox's CPU time alone.
type cpuUsager interface {
	CPUUsage(id string) (uint64, error)
}

// ticksPerSample is how many one-second ticks make a sampleInterval.
const ticksPerSample = int(sampleInterval / time.Second)

// sampleSlot is the tick (of ticksPerSample) at which a measured sandbox
// is read: every sandbox once per sampleInterval, spread evenly over the
// ticks, so that with thousands of sandboxes no tick reads them all at once
// (a burst that stalls the creates running beside it).
func sampleSlot(id string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % uint32(ticksPerSample))
}

// sample reads the CPU counter of the sandboxes due at this tick (those
// of its slot, and every one not measured yet) for the p95 window and
// idleness, and sweeps batch sandboxes' tasks. It reads the agent's
// lock-free resident view, not its full records. It also keeps the
// stats' tracked sandboxes (admission's sums) in line with the listing:
// admission tracks the sandboxes it admitted when they run, this tracks
// any other (adopted ones) and prunes the dead.
func (e *efficiency) sample(ctx context.Context, agent *node.Local, rt runtime.Runtime, tick int) {
	gen := e.stats.TrackGen() // before the listing: see StatsSampler.Prune
	sbs := agent.Residents()
	live := make(map[string]bool, len(sbs))
	now := time.Now()
	slot := tick % ticksPerSample
	cu, oneFile := rt.(cpuUsager)
	for _, sb := range sbs {
		if sb.State != node.StateRunning && sb.State != node.StatePaused {
			continue
		}
		live[sb.ID] = true
		if e.stats.CPU(sb.ID).Samples >= 2 && sampleSlot(sb.ID) != slot {
			continue
		}
		var usage uint64
		var err error
		if oneFile {
			// One cgroup file per sandbox, not the dozen of full stats.
			if usage, err = cu.CPUUsage(sb.ID); err != nil {
				continue
			}
		} else {
			cs, err := rt.Stats(sb.ID)
			if err != nil {
				continue
			}
			usage = cs.CPUUsageNanos
		}
		e.stats.ObserveCPU(sb.ID, usage)
		if e.stats.CPU(sb.ID).Rate > busyCores {
			e.mu.Lock()
			e.lastBusy[sb.ID] = now
			e.mu.Unlock()
		}
		if e.taskSchedIdle && sb.QoS == node.QoSBatch {
			e.sweepBatch(ctx, sb.ID, sb.Cgroup)
		}
	}
	e.mu.Lock()
	for id := range e.groups {
		if !live[id] {
			delete(e.groups, id)
		}
	}
	for id := range e.lastBusy {
		if !live[id] {
			delete(e.lastBusy, id)
		}
	}
	e.mu.Unlock()
	syncTracked(e.stats, agent, gen, sbs, live)
}

// liveState: the states whose sandboxes count in admission's sums.
func liveState(state string) bool { return state == node.StateRunning || state == node.StatePaused }

// track counts a sandbox seen running or paused in stats' sums, unless a
// look after tracking it finds it no longer so (a delete that forgot it
// in between would otherwise leave it counted).
func track(stats *node.StatsSampler, agent residents, sb node.Resident) {
	gen := stats.Track(sb.ID, sb.CPU)
	if r, ok := agent.Resident(sb.ID); !ok || !liveState(r.State) {
		stats.UntrackIf(sb.ID, gen)
	}
}

// syncTracked brings stats' tracked sandboxes in line with a listing of
// the agent's: it stops tracking those the listing shows dead or gone,
// and tracks any live one not tracked (admission tracks those it admitted
// when they run; this is a safety net). gen is the stats' TrackGen read
// before the listing was taken.
func syncTracked(stats *node.StatsSampler, agent residents, gen uint64, sbs []node.Resident, live map[string]bool) {
	for _, sb := range sbs {
		if live[sb.ID] && !stats.Tracked(sb.ID) {
			track(stats, agent, sb)
		}
	}
	stats.Prune(gen, func(id string) bool { return live[id] })
	for _, sb := range sbs {
		if !live[sb.ID] {
			// Not Forget: an admission may have seen this sandbox's
			// create finish since the listing, and tracked it.
			stats.ForgetUntracked(sb.ID)
		}
	}
}

// sweepBatch makes every task of a batch sandbox SCHED_IDLE: execs are
// started by a shim forked from the server, so they do not inherit the
// init's policy.
func (e *efficiency) sweepBatch(ctx context.Context, id, cgroup string) {
	g, err := e.group(ctx, id, cgroup)
	if err != nil {
		return
	}
	pids, err := g.Procs()
	if err != nil {
		return
	}
	for _, pid := range pids {
		if p, err := reclaim.SchedPolicy(pid); err == nil && p == unix.SCHED_IDLE {
			continue
		}
		if err := reclaim.SetSchedIdle(pid, true); err != nil && !errdefs.IsNotFound(err) {
			e.log.Warn("batch class: SCHED_IDLE", "sandbox", id, "pid", pid, "err", err)
		}
	}
}

func (e *efficiency) group(ctx context.Context, id, cgroup string) (cgroups.Group, error) {
	e.mu.Lock()
	g := e.groups[id]
	e.mu.Unlock()
	if g != nil {
		return g, nil
	}
	if cgroup == "" {
		return nil, fmt.Errorf("sandbox %s has no cgroup recorded: %w", id, errdefs.ErrNotFound)
	}
	g, err := e.cg.Load(ctx, cgroup)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.groups[id] = g
	e.mu.Unlock()
	return g, nil
}

// sandboxes is the reclaim controller's Source: live sandboxes with their
// cgroup, init and last activity — the later of the last API use and the
// last time the sandbox used CPU.
func (e *efficiency) sandboxes(ctx context.Context, agent *node.Local) ([]reclaim.Sandbox, error) {
	sbs, err := agent.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]reclaim.Sandbox, 0, len(sbs))
	for _, sb := range sbs {
		if sb.State != node.StateRunning && sb.State != node.StatePaused {
			continue
		}
		g, err := e.group(ctx, sb.ID, sb.Runtime.Cgroup)
		if err != nil {
			e.log.Debug("reclaim: no cgroup", "sandbox", sb.ID, "err", err)
			continue
		}
		last := sb.LastActivity
		e.mu.Lock()
		if b := e.lastBusy[sb.ID]; b.After(last) {
			last = b
		}
		e.mu.Unlock()
		out = append(out, reclaim.Sandbox{ID: sb.ID, Group: g, InitPid: sb.Runtime.Pid, LastActivity: last})
	}
	return out, nil
}

// Reports returns the reclaim controller's reports (nil when it is off).
func (e *efficiency) Reports() []reclaim.Report {
	e.mu.Lock()
	c := e.ctrl
	e.mu.Unlock()
	if c == nil {
		return nil
	}
	return c.Reports()
}

// admission is the node's admission by measured use (scheduler.Check over
// what the node measures now).
type admission struct {
	agent   residents // set by efficiency.start; nil until then
	stats   *node.StatsSampler
	policy  scheduler.Policy
	cpus    float64
	diskDir string // where sandboxes' private layers live (disk use and capacity)
	meminfo string

	// mu serialises admissions, so concurrent creates see each other.
	mu sync.Mutex
	// pending are admitted sandboxes not yet running: their expected use
	// counts until they are measured.
	pending map[string]pendingAdmission
	// expected is a newcomer's expected CPU use for its request, set by
	// usage from the node's measured sandboxes. a.mu held.
	expected func(request float64) float64
	// tracking: the stats track the agent's running sandboxes (usage
	// walked them once; Track and Forget keep the sums since). a.mu held.
	tracking bool

	hostMu sync.Mutex
	host   hostReading // the last reading, shared for hostMaxAge
}

// policyFor is the policy with the expected-use fraction of this shape.
func (a *admission) policyFor(shape scheduler.Shape) scheduler.Policy {
	p := a.policy
	if shape.CPU > 0 {
		p.ExpectedCPUFraction = a.expected(shape.CPU) / shape.CPU
	}
	return p
}

type pendingAdmission struct {
	at   time.Time
	cpu  float64
	mem  int64
	seen bool
}

var _ node.Admission = (*admission)(nil)

// residents is what admission reads of the agent (node.Local).
type residents interface {
	// EachResident calls fn with every sandbox's resource view.
	EachResident(fn func(node.Resident))
	// Resident is one sandbox's resource view.
	Resident(id string) (node.Resident, bool)
}

// shape turns a spec into what the scheduler compares.
func (a *admission) shape(spec node.SandboxSpec) scheduler.Shape {
	pids := int64(expectedPids)
	if spec.Pids > 0 && spec.Pids < pids {
		pids = spec.Pids
	}
	return scheduler.Shape{CPU: spec.CPU, MemoryBytes: spec.MemoryBytes, Pids: pids, DiskBytes: spec.DiskBytes}
}

// hostReading is what admission measures of the host itself. It is taken
// outside admission's lock (admissions see each other's pending use under
// the lock, not in the kernel's figures) and shared for hostMaxAge.
type hostReading struct {
	at                  time.Time // when the reading began
	mem                 reclaim.Node
	pidsMax, pidsUsed   int64
	diskTotal, diskUsed int64
}

func (a *admission) readHost() (hostReading, error) {
	a.hostMu.Lock()
	defer a.hostMu.Unlock()
	now := time.Now()
	if !a.host.at.IsZero() && now.Sub(a.host.at) < hostMaxAge && !now.Before(a.host.at) {
		return a.host, nil
	}
	mem, err := reclaim.ReadNode(a.meminfo)
	if err != nil {
		return hostReading{}, err
	}
	h := hostReading{at: now, mem: mem}
	h.pidsMax, h.pidsUsed = pidsOfHost()
	var fs unix.Statfs_t
	if a.diskDir != "" && unix.Statfs(a.diskDir, &fs) == nil {
		h.diskTotal = int64(fs.Blocks) * fs.Bsize
		h.diskUsed = int64(fs.Blocks-fs.Bavail) * fs.Bsize
	}
	a.host = h
	return h, nil
}

// usage is the node's use: the host's figures plus what the sandboxes are
// measured or expected to use. a.mu held.
//
// Running and paused sandboxes come from the sums the stats keep of the
// tracked ones (StatsSampler.ResidentCPU), not from a walk over every
// sandbox: a create costs O(pending admissions). A pending admission
// whose sandbox now runs is tracked before it stops counting as pending,
// and a tracked sandbox still pending is left out of the sums, so none
// counts twice or not at all.
func (a *admission) usage(h hostReading) scheduler.NodeUsage {
	u := scheduler.NodeUsage{CPUs: a.cpus, MemoryTotal: h.mem.Total, MemoryHeld: h.mem.Held,
		PidsMax: h.pidsMax, PidsUsed: h.pidsUsed, DiskTotal: h.diskTotal, DiskUsed: h.diskUsed}
	if a.agent != nil && !a.tracking {
		// Once per agent: what it ran before (sandboxes adopted at start).
		var sbs []node.Resident
		a.agent.EachResident(func(sb node.Resident) {
			if liveState(sb.State) {
				sbs = append(sbs, sb)
			}
		})
		for _, sb := range sbs { // outside the agent's lock, which track takes
			track(a.stats, a.agent, sb)
		}
		a.tracking = true
	}
	now := time.Now()
	pending := make([]string, 0, len(a.pending)) // still counted as pending
	for id, p := range a.pending {
		var sb node.Resident
		ok := false
		if a.agent != nil {
			sb, ok = a.agent.Resident(id)
		}
		switch {
		case ok && liveState(sb.State):
			track(a.stats, a.agent, sb) // counted in the sums from here on
			delete(a.pending, id)
			continue
		case ok && sb.State != node.StateCreating:
			delete(a.pending, id) // gone dead, or being deleted
			continue
		case ok:
			p.seen = true
			a.pending[id] = p
		case p.seen || now.Sub(p.at) > pendingTTL:
			delete(a.pending, id) // its create failed
			continue
		}
		pending = append(pending, id)
		u.CPUUsedP95 += p.cpu
		u.MemoryHeld += p.mem
		u.Sandboxes++
	}
	rc := a.stats.ResidentCPU(pending)
	u.Sandboxes += rc.Sandboxes
	u.CPUUsedP95 += rc.MeasuredP95
	measured, measuredSum := rc.Measured, rc.MeasuredP95
	// A sandbox without a measured rate yet is expected to use what the
	// node's measured sandboxes use on average (floored); with too few of
	// those to go by, the policy's fraction of its request.
	a.expected = func(request float64) float64 {
		if measured < minMeasuredForAverage {
			return request * a.policy.ExpectedCPUFraction
		}
		return min(request, max(measuredSum/float64(measured), minExpectedCPU))
	}
	for _, r := range rc.Unmeasured {
		u.CPUUsedP95 += a.expected(r.CPU) * float64(r.Count)
	}
	return u
}

// pidsOfHost returns the host's task limit and count (/proc/loadavg's
// running/total field counts every task).
func pidsOfHost() (limit, used int64) {
	limit = readInt("/proc/sys/kernel/pid_max")
	if t := readInt("/proc/sys/kernel/threads-max"); t > 0 && (limit == 0 || t < limit) {
		limit = t
	}
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(b))
	if len(f) < 4 {
		return 0, 0
	}
	_, total, ok := strings.Cut(f[3], "/")
	if !ok {
		return 0, 0
	}
	used, _ = strconv.ParseInt(total, 10, 64)
	return limit, used
}

func readInt(p string) int64 {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v
}

// Admit implements node.Admission.
func (a *admission) Admit(ctx context.Context, spec node.SandboxSpec) error {
	h, err := a.readHost()
	if err != nil {
		return fmt.Errorf("admission: measure node: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	u := a.usage(h)
	shape := a.shape(spec)
	if err := scheduler.Check(u, shape, a.policyFor(shape)); err != nil {
		if r := scheduler.ShortResource(err); r != "" {
			return fmt.Errorf("node full for sandbox %s: %w", spec.ID, err)
		}
		return err
	}
	cpu := a.expected(shape.CPU)
	mem := int64(float64(shape.MemoryBytes) * a.policy.ExpectedMemoryFraction)
	a.pending[spec.ID] = pendingAdmission{at: time.Now(), cpu: cpu, mem: mem}
	return nil
}

// Capacity implements node.Admission.
func (a *admission) Capacity(ctx context.Context, spec node.SandboxSpec) (*node.Capacity, error) {
	shape := a.shape(spec)
	if err := shape.Validate(); err != nil {
		return nil, err
	}
	h, err := a.readHost()
	if err != nil {
		return nil, fmt.Errorf("capacity: measure node: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	u := a.usage(h)
	fits, limiting, detail := scheduler.Capacity(u, shape, a.policyFor(shape))
	if limiting == "invalid" {
		return nil, fmt.Errorf("capacity: shape: %w", errdefs.ErrInvalidArgument)
	}
	return &node.Capacity{Fits: fits, LimitingResource: limiting, Detail: detail}, nil
}
