package cgroups

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// V2Controllers are the controllers dsec enables for its groups on v2.
var V2Controllers = []string{"cpu", "memory", "pids"}

// V2Manager manages groups in a unified (v2) hierarchy mounted at root.
type V2Manager struct {
	root string
	opts options
	// enabled caches parents whose subtree_control already delegates
	// V2Controllers, so creating the n-th sibling costs no extra writes.
	enabled sync.Map
}

var _ Manager = (*V2Manager)(nil)

// NewV2 returns a manager for the unified hierarchy at root. root must be
// a cgroup2 directory (it has cgroup.controllers).
func NewV2(root string, opts ...Option) (*V2Manager, error) {
	o, err := applyOptions(opts)
	if err != nil {
		return nil, err
	}
	if !exists(filepath.Join(root, "cgroup.controllers")) {
		return nil, fmt.Errorf("cgroups: %s is not a cgroup v2 directory (no cgroup.controllers): %w", root, errdefs.ErrFailedPrecondition)
	}
	return &V2Manager{root: root, opts: o}, nil
}

// Version implements Manager.
func (m *V2Manager) Version() int { return 2 }

// enableControllers makes sure each ancestor of name (from root down)
// delegates V2Controllers to its children.
func (m *V2Manager) enableControllers(name string) error {
	parent := m.root
	parts := strings.Split(name, "/")
	for i := 0; i < len(parts); i++ {
		if _, ok := m.enabled.Load(parent); !ok {
			if err := enableIn(parent); err != nil {
				return err
			}
			m.enabled.Store(parent, true)
		}
		if i == len(parts)-1 {
			break
		}
		parent = filepath.Join(parent, parts[i])
		if err := m.opts.mkdir(parent); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("cgroups: mkdir %s: %w", parent, classify(err))
		}
	}
	return nil
}

func enableIn(dir string) error {
	avail, err := readFile(dir, "cgroup.controllers")
	if err != nil {
		return err
	}
	on, err := readFile(dir, "cgroup.subtree_control")
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, c := range strings.Fields(string(avail)) {
		have[c] = true
	}
	enabled := map[string]bool{}
	for _, c := range strings.Fields(string(on)) {
		enabled[c] = true
	}
	var add []string
	for _, c := range V2Controllers {
		if !have[c] {
			return fmt.Errorf("cgroups: controller %q not available in %s (cgroup.controllers: %q): %w",
				c, dir, strings.TrimSpace(string(avail)), errdefs.ErrFailedPrecondition)
		}
		if !enabled[c] {
			add = append(add, "+"+c)
		}
	}
	if len(add) == 0 {
		return nil
	}
	err = writeFile(dir, "cgroup.subtree_control", strings.Join(add, " "))
	if errors.Is(err, syscall.EBUSY) {
		// v2's no-internal-process rule: a non-root group holding
		// processes cannot delegate controllers to children.
		return fmt.Errorf("cgroups: %s holds processes, so it cannot delegate controllers to child groups: %w", dir, errdefs.ErrFailedPrecondition)
	}
	return err
}

// New creates the group (and missing parents, enabling controllers in
// them) and applies r, writing only non-default values.
func (m *V2Manager) New(ctx context.Context, name string, r Resources) (Group, error) {
	name, err := cleanName(name)
	if err != nil {
		return nil, err
	}
	if err := validate(r); err != nil {
		return nil, err
	}
	if err := m.enableControllers(name); err != nil {
		return nil, err
	}
	g := &V2Group{name: name, m: m, dir: filepath.Join(m.root, name)}
	if err := m.opts.mkdir(g.dir); err != nil {
		if errors.Is(err, syscall.EEXIST) {
			return nil, fmt.Errorf("cgroups: group %q exists: %w", name, errdefs.ErrAlreadyExists)
		}
		return nil, fmt.Errorf("cgroups: mkdir %s: %w", g.dir, classify(err))
	}
	if err := g.set(r, true); err != nil {
		_ = m.opts.rmdir(g.dir)
		return nil, err
	}
	return g, nil
}

// Load returns an existing group.
func (m *V2Manager) Load(ctx context.Context, name string) (Group, error) {
	name, err := cleanName(name)
	if err != nil {
		return nil, err
	}
	g := &V2Group{name: name, m: m, dir: filepath.Join(m.root, name)}
	if !isDir(g.dir) {
		return nil, fmt.Errorf("cgroups: group %q: %w", name, errdefs.ErrNotFound)
	}
	return g, nil
}

// V2Group is one group in the unified hierarchy.
type V2Group struct {
	name string
	m    *V2Manager
	dir  string
}

var (
	_ Group     = (*V2Group)(nil)
	_ Reclaimer = (*V2Group)(nil)
)

// Name implements Group.
func (g *V2Group) Name() string { return g.name }

// Paths implements Group: {"": dir}.
func (g *V2Group) Paths() map[string]string { return map[string]string{"": g.dir} }

// AddProc moves pid into the group.
func (g *V2Group) AddProc(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("cgroups: pid %d: %w", pid, errdefs.ErrInvalidArgument)
	}
	return writeFile(g.dir, "cgroup.procs", itoa(int64(pid)))
}

// Procs lists the group's processes.
func (g *V2Group) Procs() ([]int, error) { return readProcs(g.dir) }

// Set applies r, writing every knob.
func (g *V2Group) Set(r Resources) error {
	if err := validate(r); err != nil {
		return err
	}
	return g.set(r, false)
}

func (g *V2Group) set(r Resources, fresh bool) error {
	if !fresh || r.CPUWeight != 0 {
		w := r.CPUWeight
		if w == 0 {
			w = 100
		}
		if err := writeFile(g.dir, "cpu.weight", utoa(w)); err != nil {
			return err
		}
	}
	if !fresh || r.CPUQuotaMicros != 0 || r.CPUPeriodMicros != 0 {
		period := r.CPUPeriodMicros
		if period == 0 {
			period = 100000
		}
		if err := writeFile(g.dir, "cpu.max", orMax(r.CPUQuotaMicros)+" "+utoa(period)); err != nil {
			return err
		}
	}
	if !fresh || r.CPUIdle {
		hasIdle := exists(filepath.Join(g.dir, "cpu.idle"))
		switch {
		case r.CPUIdle && !hasIdle:
			return fmt.Errorf("cgroups: CPUIdle needs cpu.idle (kernel >= 5.15) in %s: %w", g.dir, errdefs.ErrNotImplemented)
		case hasIdle:
			v := "0"
			if r.CPUIdle {
				v = "1"
			}
			if err := writeFile(g.dir, "cpu.idle", v); err != nil {
				return err
			}
		}
	}
	if !fresh || r.MemoryLimit != 0 {
		if err := writeFile(g.dir, "memory.max", orMax(r.MemoryLimit)); err != nil {
			return err
		}
	}
	if !fresh || r.MemoryHigh != 0 {
		if err := writeFile(g.dir, "memory.high", orMax(r.MemoryHigh)); err != nil {
			return err
		}
	}
	// memory.swap.max is absent when the kernel has no swap accounting;
	// only an explicit swap limit makes that an error.
	hasSwap := exists(filepath.Join(g.dir, "memory.swap.max"))
	if r.SwapLimit > 0 && !hasSwap {
		return fmt.Errorf("cgroups: swap limit needs memory.swap.max in %s: %w", g.dir, errdefs.ErrNotImplemented)
	}
	if hasSwap && (!fresh || r.SwapLimit > 0) {
		if err := writeFile(g.dir, "memory.swap.max", orMax(r.SwapLimit)); err != nil {
			return err
		}
	}
	if !fresh || r.PidsLimit != 0 {
		if err := writeFile(g.dir, "pids.max", orMax(r.PidsLimit)); err != nil {
			return err
		}
	}
	return nil
}

// Stats reads cpu.stat, memory.*, pids.* and the PSI files.
// CPUUsage implements CPUUsager.
func (g *V2Group) CPUUsage() (uint64, error) {
	cs, err := readKeyed(g.dir, "cpu.stat")
	if err != nil {
		return 0, err
	}
	return cs["usage_usec"] * 1000, nil
}

func (g *V2Group) Stats() (*Stats, error) {
	s := &Stats{}
	cs, err := readKeyed(g.dir, "cpu.stat")
	if err != nil {
		return nil, err
	}
	s.CPUUsageNanos = cs["usage_usec"] * 1000
	s.CPUThrottledNanos = cs["throttled_usec"] * 1000
	s.CPUNrThrottled = cs["nr_throttled"]

	if s.MemoryUsage, _, err = readUint(g.dir, "memory.current"); err != nil {
		return nil, err
	}
	if s.MemoryLimit, _, err = readUint(g.dir, "memory.max"); err != nil {
		return nil, err
	}
	if exists(filepath.Join(g.dir, "memory.peak")) {
		if s.MemoryMaxUsage, _, err = readUint(g.dir, "memory.peak"); err != nil {
			return nil, err
		}
	}
	ms, err := readKeyed(g.dir, "memory.stat")
	if err != nil {
		return nil, err
	}
	s.Anon, s.File, s.Shmem = ms["anon"], ms["file"], ms["shmem"]
	if k, ok := ms["kernel"]; ok {
		s.Kernel = k
	} else { // kernels before 5.18 have no "kernel" line
		s.Kernel = ms["kernel_stack"] + ms["pagetables"] + ms["percpu"] + ms["sock"] + ms["slab"]
	}
	s.ActiveAnon, s.InactiveAnon = ms["active_anon"], ms["inactive_anon"]
	s.ActiveFile, s.InactiveFile = ms["active_file"], ms["inactive_file"]
	s.Zswap, s.Zswapped = ms["zswap"], ms["zswapped"]
	if exists(filepath.Join(g.dir, "memory.swap.current")) {
		if s.Swap, _, err = readUint(g.dir, "memory.swap.current"); err != nil {
			return nil, err
		}
	}
	ev, err := readKeyed(g.dir, "memory.events")
	if err != nil {
		return nil, err
	}
	s.OOMKills = ev["oom_kill"]

	if s.PidsCurrent, _, err = readUint(g.dir, "pids.current"); err != nil {
		return nil, err
	}
	if s.PidsLimit, _, err = readUint(g.dir, "pids.max"); err != nil {
		return nil, err
	}

	s.HasPSI = true
	for file, dst := range map[string]*Pressure{
		"cpu.pressure": &s.CPUPressure, "memory.pressure": &s.MemoryPressure, "io.pressure": &s.IOPressure,
	} {
		p, err := ReadPressure(filepath.Join(g.dir, file))
		if errdefs.IsNotImplemented(err) {
			s.HasPSI = false
			s.CPUPressure, s.MemoryPressure, s.IOPressure = Pressure{}, Pressure{}, Pressure{}
			break
		}
		if err != nil {
			return nil, err
		}
		*dst = p
	}
	return s, nil
}

// Freeze writes cgroup.freeze=1 and waits for "frozen 1" in cgroup.events.
func (g *V2Group) Freeze(ctx context.Context) error { return g.freeze(ctx, 1) }

// Thaw writes cgroup.freeze=0 and waits for "frozen 0" in cgroup.events.
func (g *V2Group) Thaw(ctx context.Context) error { return g.freeze(ctx, 0) }

func (g *V2Group) events() (map[string]uint64, error) { return readKeyed(g.dir, "cgroup.events") }

func (g *V2Group) freeze(ctx context.Context, want uint64) error {
	if err := writeFile(g.dir, "cgroup.freeze", utoa(want)); err != nil {
		return err
	}
	p := g.m.opts.poller()
	for {
		ev, err := g.events()
		if err != nil {
			return err
		}
		if v, ok := ev["frozen"]; !ok {
			return fmt.Errorf("cgroups: %s/cgroup.events has no frozen line: %w", g.dir, errdefs.ErrInvalidArgument)
		} else if v == want {
			return nil
		}
		if err := p.wait(ctx); err != nil {
			if want == 1 {
				_ = writeFile(g.dir, "cgroup.freeze", "0")
			}
			return fmt.Errorf("cgroups: %s did not reach frozen=%d: %w", g.name, want, err)
		}
	}
}

// Kill uses cgroup.kill (5.14+) when present, else freeze-kill-thaw, and
// waits until cgroup.events reports "populated 0".
func (g *V2Group) Kill(ctx context.Context) error {
	hasKill := exists(filepath.Join(g.dir, "cgroup.kill"))
	if hasKill {
		if err := writeFile(g.dir, "cgroup.kill", "1"); err != nil {
			return err
		}
	}
	p := g.m.opts.poller()
	for {
		ev, err := g.events()
		if err != nil {
			return err
		}
		populated, ok := ev["populated"]
		if !ok {
			return fmt.Errorf("cgroups: %s/cgroup.events has no populated line: %w", g.dir, errdefs.ErrInvalidArgument)
		}
		if populated == 0 {
			return nil
		}
		if !hasKill {
			if err := g.Freeze(ctx); err != nil {
				return err
			}
			pids, err := g.Procs()
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			if terr := g.Thaw(context.WithoutCancel(ctx)); terr != nil {
				return terr
			}
			if err != nil {
				return err
			}
		}
		if err := p.wait(ctx); err != nil {
			return fmt.Errorf("cgroups: %s still populated: %w", g.name, err)
		}
	}
}

// Delete removes the group; it must be empty.
func (g *V2Group) Delete(ctx context.Context) error { return rmdirRetry(ctx, &g.m.opts, g.dir) }

// Reclaim writes bytes to memory.reclaim. The kernel answers EAGAIN when it
// could not reclaim that much; that is returned wrapping
// errdefs.ErrResourceExhausted (part may still have been reclaimed).
func (g *V2Group) Reclaim(bytes int64) error {
	if bytes <= 0 {
		return fmt.Errorf("cgroups: reclaim %d bytes: %w", bytes, errdefs.ErrInvalidArgument)
	}
	return writeFile(g.dir, "memory.reclaim", itoa(bytes))
}
