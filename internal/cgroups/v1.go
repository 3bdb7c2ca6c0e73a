package cgroups

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// V1Controllers are the v1 hierarchies dsec manages. cpuset is left alone
// (children inherit nothing useful from it and it needs cpus/mems set).
var V1Controllers = []string{"cpu", "cpuacct", "memory", "pids", "freezer"}

// v1Unlimited: v1 reports "no limit" as PAGE_COUNTER_MAX*PAGE_SIZE
// (9223372036854771712); anything this large is treated as unlimited.
const v1Unlimited = uint64(1) << 62

// V1Manager manages groups in v1 hierarchies mounted at root/<controller>.
type V1Manager struct {
	root string
	opts options
	// mounts maps controller -> hierarchy root; dirs lists the distinct
	// hierarchy roots (cpu and cpuacct are often one co-mounted hierarchy).
	mounts map[string]string
	dirs   []string
}

var _ Manager = (*V1Manager)(nil)

// NewV1 returns a manager for v1 hierarchies under root (normally
// /sys/fs/cgroup). Every controller in V1Controllers must be mounted.
func NewV1(root string, opts ...Option) (*V1Manager, error) {
	o, err := applyOptions(opts)
	if err != nil {
		return nil, err
	}
	m := &V1Manager{root: root, opts: o, mounts: make(map[string]string)}
	seen := map[string]bool{}
	for _, c := range V1Controllers {
		dir := filepath.Join(root, c)
		real, err := filepath.EvalSymlinks(dir)
		if err != nil || !isDir(real) {
			return nil, fmt.Errorf("cgroups: v1 controller %q not mounted at %s: %w", c, dir, errdefs.ErrFailedPrecondition)
		}
		m.mounts[c] = real
		if !seen[real] {
			seen[real] = true
			m.dirs = append(m.dirs, real)
		}
	}
	return m, nil
}

// Version implements Manager.
func (m *V1Manager) Version() int { return 1 }

func (m *V1Manager) group(name string) *V1Group {
	g := &V1Group{name: name, m: m, paths: make(map[string]string, len(m.mounts))}
	for c, dir := range m.mounts {
		g.paths[c] = filepath.Join(dir, name)
	}
	return g
}

// New creates the group in every hierarchy and applies r. Only non-default
// values are written, because a fresh cgroup already has the defaults and
// every write costs a syscall round trip. It fails with ErrAlreadyExists if
// the group exists.
func (m *V1Manager) New(ctx context.Context, name string, r Resources) (Group, error) {
	name, err := cleanName(name)
	if err != nil {
		return nil, err
	}
	if err := validate(r); err != nil {
		return nil, err
	}
	g := m.group(name)
	var created []string
	rollback := func() {
		for i := len(created) - 1; i >= 0; i-- {
			_ = m.opts.rmdir(created[i])
		}
	}
	for _, root := range m.dirs {
		dir := filepath.Join(root, name)
		err := m.opts.mkdir(dir)
		// Parents are created on demand and shared. A server that stops
		// with no sandbox left removes them, maybe just as another creates
		// one here: then make them again.
		for try := 0; try < 3 && errors.Is(err, syscall.ENOENT); try++ {
			if err = os.MkdirAll(filepath.Dir(dir), 0o755); err == nil {
				err = m.opts.mkdir(dir)
			}
		}
		if err != nil {
			rollback()
			if errors.Is(err, syscall.EEXIST) {
				return nil, fmt.Errorf("cgroups: group %q exists in %s: %w", name, root, errdefs.ErrAlreadyExists)
			}
			return nil, fmt.Errorf("cgroups: mkdir %s: %w", dir, classify(err))
		}
		created = append(created, dir)
	}
	if err := g.set(r, true); err != nil {
		rollback()
		return nil, err
	}
	g.res = r
	return g, nil
}

// Load returns an existing group; ErrNotFound if any hierarchy lacks it.
func (m *V1Manager) Load(ctx context.Context, name string) (Group, error) {
	name, err := cleanName(name)
	if err != nil {
		return nil, err
	}
	g := m.group(name)
	for c, dir := range g.paths {
		if !isDir(dir) {
			return nil, fmt.Errorf("cgroups: group %q missing in %s hierarchy: %w", name, c, errdefs.ErrNotFound)
		}
	}
	return g, nil
}

// V1Group is one group across the v1 hierarchies.
type V1Group struct {
	name  string
	m     *V1Manager
	paths map[string]string

	mu  sync.Mutex // serialises Set and ReclaimByLimit's limit dance
	res Resources
}

var (
	_ Group     = (*V1Group)(nil)
	_ Reclaimer = (*V1Group)(nil)
)

// Name implements Group.
func (g *V1Group) Name() string { return g.name }

// Paths implements Group; the map is a copy.
func (g *V1Group) Paths() map[string]string {
	out := make(map[string]string, len(g.paths))
	for k, v := range g.paths {
		out[k] = v
	}
	return out
}

// AddProc moves pid into the group in every hierarchy.
func (g *V1Group) AddProc(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("cgroups: pid %d: %w", pid, errdefs.ErrInvalidArgument)
	}
	for _, root := range g.m.dirs {
		if err := writeFile(filepath.Join(root, g.name), "cgroup.procs", itoa(int64(pid))); err != nil {
			return err
		}
	}
	return nil
}

// Procs lists the group's processes: the union over all hierarchies (see
// allProcs).
func (g *V1Group) Procs() ([]int, error) { return g.allProcs() }

// Set applies r, writing every knob (zero values reset to unlimited/default).
func (g *V1Group) Set(r Resources) error {
	if err := validate(r); err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.set(r, false); err != nil {
		return err
	}
	g.res = r
	return nil
}

func validate(r Resources) error {
	switch {
	case r.CPUWeight > 10000:
		return fmt.Errorf("cgroups: cpu weight %d out of 1..10000: %w", r.CPUWeight, errdefs.ErrInvalidArgument)
	case r.CPUQuotaMicros < 0:
		return fmt.Errorf("cgroups: negative cpu quota %d: %w", r.CPUQuotaMicros, errdefs.ErrInvalidArgument)
	case r.CPUQuotaMicros > 0 && r.CPUQuotaMicros < 1000:
		return fmt.Errorf("cgroups: cpu quota %dus below the kernel minimum of 1000us: %w", r.CPUQuotaMicros, errdefs.ErrInvalidArgument)
	case r.CPUPeriodMicros != 0 && (r.CPUPeriodMicros < 1000 || r.CPUPeriodMicros > 1000000):
		return fmt.Errorf("cgroups: cpu period %dus out of 1000..1000000: %w", r.CPUPeriodMicros, errdefs.ErrInvalidArgument)
	case r.MemoryLimit < 0, r.MemoryHigh < 0, r.PidsLimit < 0, r.SwapLimit < -1:
		return fmt.Errorf("cgroups: negative limit in %+v: %w", r, errdefs.ErrInvalidArgument)
	}
	return nil
}

// shares maps a v2 weight to v1 cpu.shares.
func shares(weight uint64) uint64 {
	if weight == 0 {
		return 1024
	}
	s := weight * 1024 / 100
	if s < 2 {
		s = 2
	}
	return s
}

func (g *V1Group) set(r Resources, fresh bool) error {
	cpu, mem, pids := g.paths["cpu"], g.paths["memory"], g.paths["pids"]
	// cpu: the kernel refuses cpu.shares writes while cpu.idle=1, so idle
	// goes off before shares are written and on after.
	hasIdle := exists(filepath.Join(cpu, "cpu.idle"))
	if r.CPUIdle && !hasIdle {
		return fmt.Errorf("cgroups: CPUIdle needs cpu.idle (kernel >= 5.15) in %s: %w", cpu, errdefs.ErrNotImplemented)
	}
	if hasIdle && !fresh && !r.CPUIdle {
		if err := writeFile(cpu, "cpu.idle", "0"); err != nil {
			return err
		}
	}
	if !r.CPUIdle && (!fresh || r.CPUWeight != 0) {
		if err := writeFile(cpu, "cpu.shares", utoa(shares(r.CPUWeight))); err != nil {
			return err
		}
	}
	if r.CPUIdle {
		if err := writeFile(cpu, "cpu.idle", "1"); err != nil {
			return err
		}
	}
	if !fresh || r.CPUPeriodMicros != 0 {
		period := r.CPUPeriodMicros
		if period == 0 {
			period = 100000
		}
		if err := writeFile(cpu, "cpu.cfs_period_us", utoa(period)); err != nil {
			return err
		}
	}
	if !fresh || r.CPUQuotaMicros != 0 {
		if err := writeFile(cpu, "cpu.cfs_quota_us", orNeg1(r.CPUQuotaMicros)); err != nil {
			return err
		}
	}

	// memory: memsw (memory+swap) must stay >= limit at every instant, so
	// it is opened up first and narrowed last.
	hasMemsw := exists(filepath.Join(mem, "memory.memsw.limit_in_bytes"))
	memsw := int64(-1)
	if r.MemoryLimit > 0 && r.SwapLimit > 0 {
		memsw = r.MemoryLimit + r.SwapLimit
	}
	if hasMemsw && !fresh {
		if err := writeFile(mem, "memory.memsw.limit_in_bytes", "-1"); err != nil {
			return err
		}
	}
	if !fresh || r.MemoryLimit != 0 {
		if err := writeFile(mem, "memory.limit_in_bytes", orNeg1(r.MemoryLimit)); err != nil {
			return err
		}
	}
	if hasMemsw && memsw > 0 {
		if err := writeFile(mem, "memory.memsw.limit_in_bytes", itoa(memsw)); err != nil {
			return err
		}
	}
	if !fresh || r.MemoryHigh != 0 {
		if err := writeFile(mem, "memory.soft_limit_in_bytes", orNeg1(r.MemoryHigh)); err != nil {
			return err
		}
	}
	if !fresh || r.PidsLimit != 0 {
		if err := writeFile(pids, "pids.max", orMax(r.PidsLimit)); err != nil {
			return err
		}
	}
	return nil
}

// Stats reads cpu, cpuacct, memory and pids figures. v1 has no per-group
// PSI, so HasPSI is false.
// CPUUsage implements CPUUsager.
func (g *V1Group) CPUUsage() (uint64, error) {
	v, _, err := readUint(g.paths["cpuacct"], "cpuacct.usage")
	return v, err
}

func (g *V1Group) Stats() (*Stats, error) {
	s := &Stats{}
	var err error
	if s.CPUUsageNanos, _, err = readUint(g.paths["cpuacct"], "cpuacct.usage"); err != nil {
		return nil, err
	}
	cs, err := readKeyed(g.paths["cpu"], "cpu.stat")
	if err != nil {
		return nil, err
	}
	s.CPUNrThrottled, s.CPUThrottledNanos = cs["nr_throttled"], cs["throttled_time"]

	mem := g.paths["memory"]
	if s.MemoryUsage, _, err = readUint(mem, "memory.usage_in_bytes"); err != nil {
		return nil, err
	}
	if s.MemoryMaxUsage, _, err = readUint(mem, "memory.max_usage_in_bytes"); err != nil {
		return nil, err
	}
	if s.MemoryLimit, _, err = readUint(mem, "memory.limit_in_bytes"); err != nil {
		return nil, err
	}
	if s.MemoryLimit >= v1Unlimited {
		s.MemoryLimit = 0
	}
	ms, err := readKeyed(mem, "memory.stat")
	if err != nil {
		return nil, err
	}
	// total_* include descendants (the node image-cache group may have
	// children); for a leaf they equal the local counters.
	get := func(k string) uint64 {
		if v, ok := ms["total_"+k]; ok {
			return v
		}
		return ms[k]
	}
	s.Anon = get("rss")
	s.File = get("cache") // includes shmem, as v2's "file" does
	s.Shmem = get("shmem")
	s.ActiveAnon, s.InactiveAnon = get("active_anon"), get("inactive_anon")
	s.ActiveFile, s.InactiveFile = get("active_file"), get("inactive_file")
	s.Swap = get("swap")
	if exists(filepath.Join(mem, "memory.kmem.usage_in_bytes")) {
		if s.Kernel, _, err = readUint(mem, "memory.kmem.usage_in_bytes"); err != nil {
			return nil, err
		}
	}
	oc, err := readOOMControl(mem)
	if err != nil {
		return nil, err
	}
	s.OOMKills = oc["oom_kill"]

	if s.PidsCurrent, _, err = readUint(g.paths["pids"], "pids.current"); err != nil {
		return nil, err
	}
	if s.PidsLimit, _, err = readUint(g.paths["pids"], "pids.max"); err != nil {
		return nil, err
	}
	return s, nil
}

func readOOMControl(mem string) (map[string]uint64, error) {
	return readKeyed(mem, "memory.oom_control")
}

// Freeze freezes the group and waits until the kernel reports FROZEN.
func (g *V1Group) Freeze(ctx context.Context) error { return g.freezer(ctx, "FROZEN") }

// Thaw thaws the group and waits until the kernel reports THAWED.
func (g *V1Group) Thaw(ctx context.Context) error { return g.freezer(ctx, "THAWED") }

func (g *V1Group) freezer(ctx context.Context, want string) error {
	dir := g.paths["freezer"]
	p := g.m.opts.poller()
	for {
		// Re-writing while FREEZING is what runc does too: a task that
		// forked mid-freeze is only caught by a fresh write.
		if err := writeFile(dir, "freezer.state", want); err != nil {
			return err
		}
		b, err := readFile(dir, "freezer.state")
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(b)) == want {
			return nil
		}
		if err := p.wait(ctx); err != nil {
			if want == "FROZEN" {
				// Do not leave a half-frozen group behind.
				_ = writeFile(dir, "freezer.state", "THAWED")
			}
			return fmt.Errorf("cgroups: %s did not reach %s: %w", g.name, want, err)
		}
	}
}

// allProcs is the union of cgroup.procs over every hierarchy. A process
// that forked while AddProc moved its parent hierarchy by hierarchy can sit
// in some hierarchies' group and not in others'.
func (g *V1Group) allProcs() ([]int, error) {
	seen := map[int]bool{}
	var out []int
	for _, root := range g.m.dirs {
		pids, err := readProcs(filepath.Join(root, g.name))
		if err != nil {
			return nil, err
		}
		for _, p := range pids {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out, nil
}

// Kill freezes the group (so nothing forks between listing and killing),
// SIGKILLs every process, thaws so the signals are delivered, and repeats
// until no hierarchy lists a process or ctx ends.
func (g *V1Group) Kill(ctx context.Context) error {
	p := g.m.opts.poller()
	for {
		pids, err := g.allProcs()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if err := g.Freeze(ctx); err != nil {
			return err
		}
		if pids, err = g.allProcs(); err != nil {
			_ = g.Thaw(context.WithoutCancel(ctx))
			return err
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL) // ESRCH: already gone
		}
		if err := g.Thaw(context.WithoutCancel(ctx)); err != nil {
			return err
		}
		if err := p.wait(ctx); err != nil {
			left, _ := g.allProcs()
			return fmt.Errorf("cgroups: %s still has processes %v: %w", g.name, left, err)
		}
	}
}

// Delete removes the group from every hierarchy; it must hold no process.
func (g *V1Group) Delete(ctx context.Context) error {
	roots := append([]string(nil), g.m.dirs...)
	sort.Strings(roots)
	var errs []error
	for _, root := range roots {
		if err := rmdirRetry(ctx, &g.m.opts, filepath.Join(root, g.name)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Reclaim asks the kernel to reclaim about bytes from the group by lowering
// memory.limit_in_bytes to usage-bytes for an instant. The OOM killer is
// disabled for the group meanwhile, so a task that allocates in that window
// waits instead of being killed; the original limit and OOM setting are put
// back before returning. The kernel refuses with EBUSY when it cannot get
// below the new limit; that returns an error wrapping
// errdefs.ErrResourceExhausted (part may still have been reclaimed).
func (g *V1Group) Reclaim(bytes int64) error {
	if bytes <= 0 {
		return fmt.Errorf("cgroups: reclaim %d bytes: %w", bytes, errdefs.ErrInvalidArgument)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	mem := g.paths["memory"]
	usage, _, err := readUint(mem, "memory.usage_in_bytes")
	if err != nil {
		return err
	}
	limit, _, err := readUint(mem, "memory.limit_in_bytes")
	if err != nil {
		return err
	}
	oc, err := readOOMControl(mem)
	if err != nil {
		return err
	}
	const floor = 4 << 20 // never aim below a few MiB: init must run
	target := int64(usage) - bytes
	if target < floor {
		target = floor
	}
	if uint64(target) >= usage {
		return fmt.Errorf("cgroups: %s uses %d bytes, at the reclaim floor: %w", g.name, usage, errdefs.ErrResourceExhausted)
	}
	if oc["oom_kill_disable"] == 0 {
		if err := writeFile(mem, "memory.oom_control", "1"); err != nil {
			return err
		}
		defer func() {
			if rerr := writeFile(mem, "memory.oom_control", "0"); rerr != nil {
				g.m.opts.logger.Error("cgroups: restore oom_control", "group", g.name, "err", rerr)
			}
		}()
	}
	stepErr := writeFile(mem, "memory.limit_in_bytes", itoa(target))
	restore := "-1"
	if limit < v1Unlimited {
		restore = utoa(limit)
	}
	if err := writeFile(mem, "memory.limit_in_bytes", restore); err != nil {
		return fmt.Errorf("cgroups: restore memory limit of %s: %w", g.name, err)
	}
	return stepErr
}
