package reclaim

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// fakeKernelGroup is a real cgroups.V2Group over a fake tree, plus the
// kernel's side of memory.reclaim: it takes what is cold, updates
// memory.current and memory.stat, and answers like EAGAIN when it could
// not take all that was asked.
type fakeKernelGroup struct {
	cgroups.Group
	t     *testing.T
	dir   string
	usage int64
	cold  int64 // shown as inactive_file
	stuck int64 // part of cold the kernel cannot actually take
	asked []int64
}

func (k *fakeKernelGroup) Reclaim(n int64) error {
	if err := k.Group.(cgroups.Reclaimer).Reclaim(n); err != nil {
		return err
	}
	b, _ := os.ReadFile(filepath.Join(k.dir, "memory.reclaim"))
	v, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		k.t.Fatalf("memory.reclaim holds %q", b)
	}
	k.asked = append(k.asked, v)
	take := min(v, k.cold-k.stuck)
	k.cold -= take
	k.usage -= take
	k.sync()
	if take < v {
		return fmt.Errorf("fake kernel: reclaimed %d of %d: %w", take, v, errdefs.ErrResourceExhausted)
	}
	return nil
}

func (k *fakeKernelGroup) sync() {
	put := func(f, v string) {
		if err := os.WriteFile(filepath.Join(k.dir, f), []byte(v), 0o644); err != nil {
			k.t.Fatal(err)
		}
	}
	put("memory.current", strconv.FormatInt(k.usage, 10))
	put("memory.stat", fmt.Sprintf("anon %d\nfile %d\nkernel 0\nshmem 0\ninactive_file %d\nactive_file 0\ninactive_anon 0\nactive_anon %d\n",
		k.usage-k.cold, k.cold, k.cold, k.usage-k.cold))
}

func (k *fakeKernelGroup) setPSI(totalMicros uint64) {
	v := fmt.Sprintf("some avg10=0.00 avg60=0.00 avg300=0.00 total=%d\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", totalMicros)
	if err := os.WriteFile(filepath.Join(k.dir, "memory.pressure"), []byte(v), 0o644); err != nil {
		k.t.Fatal(err)
	}
}

// settings are the files reclaim must never leave changed.
var settings = []string{"memory.max", "memory.high", "memory.swap.max", "memory.low", "memory.min", "cpu.max", "cpu.weight"}

func newFakeKernelGroup(t *testing.T, usage, cold int64) *fakeKernelGroup {
	t.Helper()
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpu memory pids"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "sb")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	psi := "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
	for f, v := range map[string]string{
		"cgroup.procs": "", "cpu.stat": "usage_usec 0\nnr_throttled 0\nthrottled_usec 0\n",
		"memory.max": "1073741824", "memory.high": "max", "memory.swap.max": "max", "memory.low": "0", "memory.min": "0",
		"cpu.max": "max 100000", "cpu.weight": "100",
		"memory.events": "oom_kill 0\n", "memory.reclaim": "", "pids.current": "1", "pids.max": "max",
		"memory.pressure": psi, "cpu.pressure": psi, "io.pressure": psi,
	} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m, err := cgroups.NewV2(root)
	if err != nil {
		t.Fatal(err)
	}
	g, err := m.Load(context.Background(), "sb")
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKernelGroup{Group: g, t: t, dir: dir, usage: usage, cold: cold}
	k.sync()
	return k
}

func snapshot(t *testing.T, dir string) map[string]string {
	out := map[string]string{}
	for _, f := range settings {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		out[f] = string(b)
	}
	return out
}

func TestControllerDecisions(t *testing.T) {
	const (
		minStep = 1 * mib
		pass    = 6 * time.Second
	)
	held := 200 * mib
	tests := []struct {
		name      string
		idleFor   time.Duration
		cold      int64
		stuck     int64
		psiDelta  uint64 // stall micros between pass 1 and pass 2
		wantAsked []int64
		wantState string
	}{
		{name: "active sandbox is left alone", idleFor: time.Second, cold: 100 * mib, wantState: "active"},
		{name: "idle, calm: minimum first, then a full step", idleFor: 10 * time.Minute, cold: 100 * mib,
			wantAsked: []int64{minStep, (held - minStep) / 20}, wantState: "reclaiming"},
		{name: "idle, pressure above threshold: backs off", idleFor: 10 * time.Minute, cold: 100 * mib,
			psiDelta: 60000, wantAsked: []int64{minStep}, wantState: "backoff"},
		{name: "idle, half the threshold: half a step", idleFor: 10 * time.Minute, cold: 100 * mib,
			psiDelta: 3000, wantAsked: []int64{minStep, (held - minStep) / 40}, wantState: "reclaiming"},
		{name: "step never exceeds what is cold", idleFor: 10 * time.Minute, cold: 4 * mib,
			wantAsked: []int64{minStep, 3 * mib}, wantState: "reclaiming"},
		{name: "nothing cold: done without asking", idleFor: 10 * time.Minute, cold: minStep / 2, wantState: "done"},
		{name: "kernel finds less than it shows: done", idleFor: 10 * time.Minute, cold: 10 * mib, stuck: 9*mib + mib/2,
			wantAsked: []int64{minStep}, wantState: "done"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := newFakeKernelGroup(t, held, tc.cold)
			k.stuck = tc.stuck
			before := snapshot(t, k.dir)
			now := time.Unix(1_000_000, 0)
			last := now.Add(-tc.idleFor)
			src := SourceFunc(func(context.Context) ([]Sandbox, error) {
				return []Sandbox{{ID: "sb", Group: k, LastActivity: last}}, nil
			})
			c, err := NewController(src, nil, Config{IdleAfter: time.Minute, MinStep: minStep, MaxStep: 64 * mib,
				StepFraction: 0.05, PressureThreshold: 0.001, Now: func() time.Time { return now },
				SwapAvailable: func() bool { return false }})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := c.Tick(ctx); err != nil {
				t.Fatal(err)
			}
			now = now.Add(pass)
			k.setPSI(tc.psiDelta)
			if err := c.Tick(ctx); err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(k.asked) != fmt.Sprint(tc.wantAsked) {
				t.Fatalf("asked %v, want %v", k.asked, tc.wantAsked)
			}
			r, ok := c.ReportFor("sb")
			if !ok || r.State != tc.wantState {
				t.Fatalf("report %+v, want state %q", r, tc.wantState)
			}
			var sum int64
			for _, a := range k.asked {
				sum += a
			}
			if want := min(sum, tc.cold-tc.stuck); r.Reclaimed != want {
				t.Fatalf("reclaimed %d, want %d", r.Reclaimed, want)
			}
			if after := snapshot(t, k.dir); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatalf("settings changed:\n%v\n%v", before, after)
			}
		})
	}
}

// After "done", the controller does not keep asking until the sandbox grows;
// a wake ends the idle period; a deleted sandbox is dropped.
func TestControllerLifecycle(t *testing.T) {
	k := newFakeKernelGroup(t, 100*mib, 10*mib)
	k.stuck = 10 * mib // the kernel can take nothing
	now := time.Unix(1_000_000, 0)
	last := now.Add(-time.Hour)
	present := true
	src := SourceFunc(func(context.Context) ([]Sandbox, error) {
		if !present {
			return nil, nil
		}
		return []Sandbox{{ID: "sb", Group: k, LastActivity: last}}, nil
	})
	c, err := NewController(src, nil, Config{IdleAfter: time.Minute, Now: func() time.Time { return now },
		SwapAvailable: func() bool { return false }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tick := func() {
		t.Helper()
		now = now.Add(6 * time.Second)
		if err := c.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	tick()
	if r, _ := c.ReportFor("sb"); r.State != "done" || len(k.asked) != 1 {
		t.Fatalf("after an empty reclaim: %+v asked %v", r, k.asked)
	}
	tick()
	tick()
	if len(k.asked) != 1 {
		t.Fatalf("kept asking after done: %v", k.asked)
	}
	// The sandbox grows by more than a step: try again.
	k.usage += 5 * mib
	k.cold += 5 * mib
	k.stuck = 0
	k.sync()
	tick()
	if len(k.asked) != 2 {
		t.Fatalf("did not retry after growth: %v", k.asked)
	}
	c.Wake("sb")
	if r, _ := c.ReportFor("sb"); r.State != "active" || r.Idle {
		t.Fatalf("after Wake: %+v", r)
	}
	last = now // activity
	tick()
	if r, _ := c.ReportFor("sb"); r.State != "active" || len(k.asked) != 2 {
		t.Fatalf("active sandbox reclaimed: %+v %v", r, k.asked)
	}
	present = false
	tick()
	if rs := c.Reports(); len(rs) != 0 {
		t.Fatalf("deleted sandbox still reported: %+v", rs)
	}
}

func TestControllerErrors(t *testing.T) {
	if _, err := NewController(nil, nil, Config{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("nil source: %v", err)
	}
	src := SourceFunc(func(context.Context) ([]Sandbox, error) { return nil, nil })
	for _, cfg := range []Config{
		{StepFraction: 2}, {MinStep: 10, MaxStep: 5}, {PressureThreshold: 1}, {IdleAfter: -1},
	} {
		if _, err := NewController(src, nil, cfg); !errdefs.IsInvalidArgument(err) {
			t.Errorf("config %+v: %v", cfg, err)
		}
	}
	// A broken stats file marks the sandbox as errored, keeps others going.
	k := newFakeKernelGroup(t, 100*mib, 50*mib)
	good := newFakeKernelGroup(t, 100*mib, 50*mib)
	if err := os.WriteFile(filepath.Join(k.dir, "memory.stat"), []byte("garbage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	long := time.Now().Add(-time.Hour)
	c, err := NewController(SourceFunc(func(context.Context) ([]Sandbox, error) {
		return []Sandbox{{ID: "bad", Group: k, LastActivity: long}, {ID: "good", Group: good, LastActivity: long}}, nil
	}), nil, Config{IdleAfter: time.Minute, SwapAvailable: func() bool { return false }})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r, _ := c.ReportFor("bad"); r.State != "error" || !strings.Contains(r.LastError, "memory.stat") {
		t.Errorf("bad sandbox report %+v", r)
	}
	if r, _ := c.ReportFor("good"); r.State != "reclaiming" || len(good.asked) != 1 {
		t.Errorf("good sandbox report %+v asked %v", r, good.asked)
	}
	failing := SourceFunc(func(context.Context) ([]Sandbox, error) { return nil, errdefs.ErrUnavailable })
	c2, _ := NewController(failing, nil, Config{})
	if err := c2.Tick(context.Background()); !errdefs.IsUnavailable(err) {
		t.Errorf("source error: %v", err)
	}
}

// On real v1: an idle sandbox's page cache is reclaimed in steps, its
// limit and OOM setting are as before, and its process lives on.
func TestControllerRealV1PageCache(t *testing.T) {
	g := v1Group(t, cgroups.Resources{MemoryLimit: 512 << 20})
	file := diskFile(t, int(48*mib))
	h := startHelper(t, g, "READ_FILE="+file)
	mem := g.Paths()["memory"]
	limitBefore := readString(t, mem, "memory.limit_in_bytes")
	oomBefore := readString(t, mem, "memory.oom_control")
	st0, _ := g.Stats()

	src := SourceFunc(func(context.Context) ([]Sandbox, error) {
		return []Sandbox{{ID: "sb", Group: g, InitPid: h.pid(), LastActivity: time.Now().Add(-time.Hour)}}, nil
	})
	c, err := NewController(src, nil, Config{IdleAfter: time.Minute, MinStep: 4 * mib, StepFraction: 0.25,
		PressureThreshold: 0.5, SwapAvailable: func() bool { return false }})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if err := c.Tick(context.Background()); err != nil {
			t.Fatal(err)
		}
		if r, _ := c.ReportFor("sb"); r.State == "done" || r.State == "error" {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	r, _ := c.ReportFor("sb")
	st1, _ := g.Stats()
	t.Logf("report %+v; file %d -> %d MiB", r, st0.File>>20, st1.File>>20)
	if r.LastError != "" || r.Reclaimed < 32*mib {
		t.Errorf("reclaimed %d MiB (err %q), want >= 32 MiB of 48 MiB page cache", r.Reclaimed>>20, r.LastError)
	}
	if got := readString(t, mem, "memory.limit_in_bytes"); got != limitBefore {
		t.Errorf("limit %s, was %s", got, limitBefore)
	}
	if got := readString(t, mem, "memory.oom_control"); got != oomBefore {
		t.Errorf("oom_control %q, was %q", got, oomBefore)
	}
	if err := syscall.Kill(h.pid(), 0); err != nil {
		t.Errorf("sandbox process gone: %v", err)
	}
}

// On real v1 with zram: the controller's pageout pass sends the idle
// process's anon memory to swap; the process reads it back intact.
func TestControllerRealV1PageoutWithZram(t *testing.T) {
	g := v1Group(t, cgroups.Resources{MemoryLimit: 512 << 20})
	zramSwap(t, 256*mib)
	h := startHelper(t, g, "ALLOC_MIB=48")
	src := SourceFunc(func(context.Context) ([]Sandbox, error) {
		return []Sandbox{{ID: "sb", Group: g, InitPid: h.pid(), LastActivity: time.Now().Add(-time.Hour)}}, nil
	})
	c, err := NewController(src, nil, Config{IdleAfter: time.Minute, Pageout: true})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := ReadProcMemory(h.pid())
	if err := c.Tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	after, _ := ReadProcMemory(h.pid())
	r, _ := c.ReportFor("sb")
	t.Logf("report %+v; RssAnon %d -> %d MiB, swap %d MiB", r, before.RssAnon>>20, after.RssAnon>>20, after.Swap>>20)
	if r.Reclaimed < 40*mib || before.RssAnon-after.RssAnon < 40*mib {
		t.Errorf("reclaimed %d MiB, RssAnon drop %d MiB; want >= 40 MiB", r.Reclaimed>>20, (before.RssAnon-after.RssAnon)>>20)
	}
	h.send(t, "check")
	h.expect(t, "ok")
}

func readString(t *testing.T, dir, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestControllerRun(t *testing.T) {
	calls := make(chan struct{}, 100)
	src := SourceFunc(func(context.Context) ([]Sandbox, error) {
		calls <- struct{}{}
		return nil, nil
	})
	c, err := NewController(src, nil, Config{Interval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for i := 0; i < 3; i++ {
		select {
		case <-calls:
		case <-time.After(5 * time.Second):
			t.Fatal("Run does not tick")
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not stop with its context")
	}
}
