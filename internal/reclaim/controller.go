package reclaim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Sandbox is what the controller needs to know about one sandbox.
type Sandbox struct {
	ID           string
	Group        cgroups.Group
	InitPid      int
	LastActivity time.Time
}

// Source lists the node's sandboxes (the node agent implements it).
type Source interface {
	Sandboxes(ctx context.Context) ([]Sandbox, error)
}

// SourceFunc adapts a function to Source.
type SourceFunc func(ctx context.Context) ([]Sandbox, error)

// Sandboxes implements Source.
func (f SourceFunc) Sandboxes(ctx context.Context) ([]Sandbox, error) { return f(ctx) }

// Config tunes the controller. Zero fields take the defaults below.
type Config struct {
	// IdleAfter: a sandbox without activity for this long is reclaimed.
	IdleAfter time.Duration // default 60s
	// Interval between passes (Run).
	Interval time.Duration // default 6s (Senpai's)
	// StepFraction of the group's held memory is asked back per pass
	// when there is no pressure, shrinking linearly to 0 as the stall
	// fraction approaches PressureThreshold.
	StepFraction float64 // default 0.05
	MinStep      int64   // default 1 MiB
	MaxStep      int64   // default 64 MiB
	// PressureThreshold is the share of wall time some task of the group
	// (v2) or of the node (v1: no per-group PSI) may be stalled on memory
	// between two passes before reclaim pauses.
	PressureThreshold float64 // default 0.001 (1 ms per second)
	// Pageout makes the first pass of an idle period on v1 also
	// process_madvise(MADV_PAGEOUT) the sandbox's mappings (file always,
	// anon when swap is available).
	Pageout bool
	// SwapAvailable reports whether cold anon can go anywhere. Default:
	// SwapFree > 0 in /proc/meminfo.
	SwapAvailable func() bool
	// SystemPressure is the node PSI file used when a group has none.
	SystemPressure string // default /proc/pressure/memory
	// Now is the clock (tests).
	Now func() time.Time
}

func (c *Config) defaults() error {
	if c.IdleAfter == 0 {
		c.IdleAfter = 60 * time.Second
	}
	if c.Interval == 0 {
		c.Interval = 6 * time.Second
	}
	if c.StepFraction == 0 {
		c.StepFraction = 0.05
	}
	if c.MinStep == 0 {
		c.MinStep = 1 << 20
	}
	if c.MaxStep == 0 {
		c.MaxStep = 64 << 20
	}
	if c.PressureThreshold == 0 {
		c.PressureThreshold = 0.001
	}
	if c.SystemPressure == "" {
		c.SystemPressure = "/proc/pressure/memory"
	}
	if c.SwapAvailable == nil {
		c.SwapAvailable = func() bool {
			n, err := ReadNode("/proc/meminfo")
			return err == nil && n.SwapAvailable
		}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	switch {
	case c.IdleAfter < 0, c.Interval < 0:
		return fmt.Errorf("reclaim: negative idle time or interval: %w", errdefs.ErrInvalidArgument)
	case c.StepFraction < 0 || c.StepFraction > 1:
		return fmt.Errorf("reclaim: step fraction %v outside 0..1: %w", c.StepFraction, errdefs.ErrInvalidArgument)
	case c.MinStep < 0 || c.MaxStep < c.MinStep:
		return fmt.Errorf("reclaim: step bounds %d..%d: %w", c.MinStep, c.MaxStep, errdefs.ErrInvalidArgument)
	case c.PressureThreshold < 0 || c.PressureThreshold >= 1:
		return fmt.Errorf("reclaim: pressure threshold %v outside 0..1: %w", c.PressureThreshold, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Report is the controller's view of one sandbox.
type Report struct {
	ID   string `json:"id"`
	Idle bool   `json:"idle"`
	// Reclaimed is the drop of the group's charge caused by reclaim, in
	// bytes, summed since the controller first saw the sandbox.
	Reclaimed int64 `json:"reclaimed_bytes"`
	Steps     int   `json:"steps"`
	// State: "active", "reclaiming", "backoff" (pressure too high),
	// "done" (nothing cold left this idle period) or "error".
	State     string  `json:"state"`
	Stall     float64 `json:"stall"` // last measured stall fraction
	LastError string  `json:"last_error,omitempty"`
}

type sbState struct {
	Report
	lastActivity time.Time
	paged        bool  // v1 pageout done this idle period
	doneHeld     int64 // held when the kernel last found nothing to take
	lastPSI      uint64
	lastPSIAt    time.Time
	lastPSIFrom  string
}

// Controller reclaims cold memory of idle sandboxes, a step per pass,
// guided by memory pressure in the manner of Senpai: step while nothing
// stalls, pause when something does. It never sets a limit that stays: v2
// uses memory.reclaim; v1 uses the group's Reclaimer (an instant lower
// limit with the OOM killer off, restored before returning) and
// process_madvise(MADV_PAGEOUT). A sandbox that wakes faults its pages back
// in; nothing is killed, and there is nothing to restore.
type Controller struct {
	cfg Config
	src Source
	log *slog.Logger

	mu sync.Mutex
	sb map[string]*sbState
}

// NewController returns a controller; call Run or Tick.
func NewController(src Source, log *slog.Logger, cfg Config) (*Controller, error) {
	if src == nil {
		return nil, fmt.Errorf("reclaim: nil source: %w", errdefs.ErrInvalidArgument)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	return &Controller{cfg: cfg, src: src, log: log, sb: map[string]*sbState{}}, nil
}

// Run calls Tick every Interval until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		if err := c.Tick(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("reclaim: pass failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Tick makes one pass over the sandboxes.
func (c *Controller) Tick(ctx context.Context) error {
	list, err := c.src.Sandboxes(ctx)
	if err != nil {
		return fmt.Errorf("reclaim: list sandboxes: %w", err)
	}
	seen := make(map[string]bool, len(list))
	swap := c.cfg.SwapAvailable()
	for _, sb := range list {
		if err := ctx.Err(); err != nil {
			return err
		}
		seen[sb.ID] = true
		c.step(ctx, sb, swap)
	}
	c.mu.Lock()
	for id := range c.sb {
		if !seen[id] {
			delete(c.sb, id)
		}
	}
	c.mu.Unlock()
	return nil
}

// Wake tells the controller a sandbox was just used: its idle period (and
// any backoff) ends at once rather than at the next pass.
func (c *Controller) Wake(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.sb[id]; st != nil {
		st.Idle, st.State, st.paged, st.doneHeld = false, "active", false, 0
	}
}

// Forget drops a deleted sandbox.
func (c *Controller) Forget(id string) {
	c.mu.Lock()
	delete(c.sb, id)
	c.mu.Unlock()
}

// Reports returns every sandbox's report, sorted by ID.
func (c *Controller) Reports() []Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Report, 0, len(c.sb))
	for _, st := range c.sb {
		out = append(out, st.Report)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// ReportFor returns one sandbox's report.
func (c *Controller) ReportFor(id string) (Report, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, ok := c.sb[id]
	if !ok {
		return Report{}, false
	}
	return st.Report, true
}

func (c *Controller) state(id string) *sbState {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.sb[id]
	if st == nil {
		st = &sbState{Report: Report{ID: id, State: "active"}}
		c.sb[id] = st
	}
	return st
}

// update applies fn to the sandbox's state under the lock.
func (c *Controller) update(st *sbState, fn func()) {
	c.mu.Lock()
	fn()
	c.mu.Unlock()
}

func (c *Controller) step(ctx context.Context, sb Sandbox, swap bool) {
	st := c.state(sb.ID)
	now := c.cfg.Now()
	if now.Sub(sb.LastActivity) < c.cfg.IdleAfter {
		c.update(st, func() {
			st.Idle, st.State, st.paged, st.doneHeld = false, "active", false, 0
		})
		return
	}
	c.update(st, func() {
		if !st.Idle || !sb.LastActivity.Equal(st.lastActivity) {
			// A new idle period (or activity between two passes).
			st.Idle, st.paged, st.doneHeld, st.State = true, false, 0, "reclaiming"
			st.lastActivity = sb.LastActivity
		}
	})
	stats, err := sb.Group.Stats()
	if err != nil {
		c.fail(st, sb, "stats", err)
		return
	}
	stall, ok := c.stall(st, stats, now)
	c.update(st, func() { st.Stall = stall })
	if ok && stall >= c.cfg.PressureThreshold {
		c.update(st, func() { st.State = "backoff" })
		c.log.Debug("reclaim: backing off", "sandbox", sb.ID, "stall", stall)
		return
	}
	mem := MemoryOf(stats, swap)
	before := stats.MemoryUsage
	c.mu.Lock()
	doneHeld, paged := st.doneHeld, st.paged
	c.mu.Unlock()
	if doneHeld > 0 && mem.Held < doneHeld+c.cfg.MinStep {
		return // nothing cold was left, and the sandbox has not grown since
	}
	_, isV2 := sb.Group.Paths()[""]
	exhausted := false

	if c.cfg.Pageout && !paged && !isV2 {
		pids, err := sb.Group.Procs()
		if err != nil {
			c.fail(st, sb, "procs", err)
			return
		}
		res, err := Pageout(ctx, pids, PageoutKinds{Anon: swap, File: true})
		if err != nil {
			c.fail(st, sb, "pageout", err)
			return
		}
		c.update(st, func() { st.paged = true })
		c.log.Debug("reclaim: pageout", "sandbox", sb.ID, "processes", res.Processes, "ranges", res.Ranges, "advised", res.Bytes)
	} else {
		if mem.Reclaimable < c.cfg.MinStep {
			c.update(st, func() { st.State = "done" })
			return
		}
		// Without a pressure reading (first pass, or no PSI at all) step
		// at the minimum; with one, scale down as stalls approach the
		// threshold.
		step := c.cfg.MinStep
		if ok && c.cfg.PressureThreshold > 0 {
			step = int64(float64(mem.Held) * c.cfg.StepFraction * (1 - stall/c.cfg.PressureThreshold))
		}
		step = max(c.cfg.MinStep, min(step, c.cfg.MaxStep, mem.Reclaimable))
		r, isR := sb.Group.(cgroups.Reclaimer)
		if !isR {
			c.fail(st, sb, "reclaim", fmt.Errorf("group %s cannot reclaim: %w", sb.Group.Name(), errdefs.ErrNotImplemented))
			return
		}
		if err := r.Reclaim(step); err != nil {
			if !errdefs.IsResourceExhausted(err) {
				c.fail(st, sb, "reclaim", err)
				return
			}
			// The kernel found nothing more to take: done until the
			// sandbox wakes or grows.
			exhausted = true
		}
	}
	after, err := sb.Group.Stats()
	if err != nil {
		c.fail(st, sb, "stats", err)
		return
	}
	var got int64
	if after.MemoryUsage < before {
		got = int64(before - after.MemoryUsage)
	}
	c.update(st, func() {
		st.Reclaimed += got
		st.Steps++
		st.LastError = ""
		st.State = "reclaiming"
		if exhausted {
			st.State, st.doneHeld = "done", max(1, MemoryOf(after, swap).Held)
		}
	})
	c.log.Debug("reclaim: step", "sandbox", sb.ID, "reclaimed", got, "held", after.MemoryUsage)
}

// stall returns the fraction of time stalled on memory since the last
// pass: the group's "some" PSI when it has PSI, else the node's.
func (c *Controller) stall(st *sbState, s *cgroups.Stats, now time.Time) (float64, bool) {
	var total uint64
	from := "group"
	if s.HasPSI {
		total = s.MemoryPressure.Some.TotalMicros
	} else {
		p, err := cgroups.ReadPressure(c.cfg.SystemPressure)
		if err != nil {
			return 0, false // no PSI anywhere: step at the minimum pace
		}
		total, from = p.Some.TotalMicros, "node"
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	prev, prevAt, prevFrom := st.lastPSI, st.lastPSIAt, st.lastPSIFrom
	st.lastPSI, st.lastPSIAt, st.lastPSIFrom = total, now, from
	if prevAt.IsZero() || prevFrom != from || total < prev || !now.After(prevAt) {
		return 0, false // first reading: no stall known yet
	}
	return float64(total-prev) / float64(now.Sub(prevAt).Microseconds()), true
}

func (c *Controller) fail(st *sbState, sb Sandbox, what string, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	c.update(st, func() {
		st.State, st.LastError = "error", what+": "+err.Error()
	})
	c.log.Warn("reclaim: step failed", "sandbox", sb.ID, "op", what, "err", err)
}
