package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/scheduler"
)

// testAdmission measures a fake meminfo (total/available in MiB) and no
// agent: only pending admissions are on the node.
func testAdmission(t *testing.T, totalMiB, availMiB int64, cpus, overcommit float64) *admission {
	t.Helper()
	p := filepath.Join(t.TempDir(), "meminfo")
	content := fmt.Sprintf("MemTotal: %d kB\nMemAvailable: %d kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n", totalMiB<<10, availMiB<<10)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	stats, err := node.NewStatsSampler(1, time.Minute, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	pol := scheduler.DefaultPolicy()
	pol.CPUOvercommit = overcommit
	return &admission{stats: stats, policy: pol, cpus: cpus, meminfo: p, pending: map[string]pendingAdmission{}}
}

func TestAdmissionRefusalNamesResource(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		spec     node.SandboxSpec
		resource string
	}{
		// 4096 MiB total, 1024 available: 3072 held + 512 reserve leaves 512.
		{"memory", node.SandboxSpec{ID: "a", CPU: 1, MemoryBytes: 600 << 20}, scheduler.ResourceMemory},
		{"cpu", node.SandboxSpec{ID: "b", CPU: 9, MemoryBytes: 64 << 20}, scheduler.ResourceCPU},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := testAdmission(t, 4096, 1024, 2, 4)
			err := a.Admit(ctx, tc.spec)
			if !errdefs.IsResourceExhausted(err) {
				t.Fatalf("want resource exhausted, got %v", err)
			}
			if got := scheduler.ShortResource(err); got != tc.resource {
				t.Fatalf("refusal names %q, want %q (%v)", got, tc.resource, err)
			}
			if len(a.pending) != 0 {
				t.Fatal("a refused sandbox stays counted")
			}
		})
	}
}

// Admitted sandboxes count with their expected use until they run, so
// concurrent creates cannot all pass the same free memory.
func TestAdmissionCountsPending(t *testing.T) {
	ctx := context.Background()
	a := testAdmission(t, 4096, 2048, 2, 20) // 2048 - 512 reserve = 1536 free
	spec := node.SandboxSpec{CPU: 1, MemoryBytes: 512 << 20}
	for i := 0; i < 3; i++ {
		spec.ID = fmt.Sprintf("s%d", i)
		if err := a.Admit(ctx, spec); err != nil {
			t.Fatalf("admission %d: %v", i, err)
		}
	}
	spec.ID = "s3"
	err := a.Admit(ctx, spec)
	if scheduler.ShortResource(err) != scheduler.ResourceMemory {
		t.Fatalf("fourth 512 MiB sandbox in 1536 MiB: want a memory refusal, got %v", err)
	}
	capy, err := a.Capacity(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if capy.Fits != 0 || capy.LimitingResource != scheduler.ResourceMemory {
		t.Fatalf("capacity %+v, want 0 limited by memory", capy)
	}
	// A pending admission whose sandbox never appeared expires.
	for id, p := range a.pending {
		p.at = time.Now().Add(-2 * pendingTTL)
		a.pending[id] = p
	}
	if err := a.Admit(ctx, spec); err != nil {
		t.Fatalf("after the pending admissions expired: %v", err)
	}
}

func TestAdmissionCapacityFigures(t *testing.T) {
	ctx := context.Background()
	a := testAdmission(t, 8192, 6144, 2, 10) // 6144 - 512 reserve = 5632 MiB free
	capy, err := a.Capacity(ctx, node.SandboxSpec{CPU: 1, MemoryBytes: 512 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if capy.Detail[scheduler.ResourceMemory] != 11 || capy.Detail[scheduler.ResourceCPU] != 20 {
		t.Fatalf("detail %v, want memory 11 (5632/512), cpu 20 (2 cores x 10)", capy.Detail)
	}
	if capy.Fits != 11 || capy.LimitingResource != scheduler.ResourceMemory {
		t.Fatalf("capacity %+v, want 11 limited by memory", capy)
	}
	capy, err = a.Capacity(ctx, node.SandboxSpec{CPU: 2, MemoryBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if capy.Fits != 10 || capy.LimitingResource != scheduler.ResourceCPU {
		t.Fatalf("capacity %+v, want 10 limited by cpu", capy)
	}
	if _, err := a.Capacity(ctx, node.SandboxSpec{CPU: -1, MemoryBytes: 64 << 20}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("negative cpu: want invalid argument, got %v", err)
	}
}

// Admissions close together share one reading of the host's figures, at
// most hostMaxAge old.
func TestAdmissionSharesHostReading(t *testing.T) {
	ctx := context.Background()
	a := testAdmission(t, 8192, 6144, 2, 10) // 6144 - 512 reserve = 5632 MiB free
	memFits := func() int {
		t.Helper()
		c, err := a.Capacity(ctx, node.SandboxSpec{CPU: 1, MemoryBytes: 512 << 20})
		if err != nil {
			t.Fatal(err)
		}
		return c.Detail[scheduler.ResourceMemory]
	}
	if n := memFits(); n != 11 {
		t.Fatalf("memory fits %d, want 11", n)
	}
	content := fmt.Sprintf("MemTotal: %d kB\nMemAvailable: %d kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n", 8192<<10, 2048<<10)
	if err := os.WriteFile(a.meminfo, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	n := memFits()
	if time.Since(start) < hostMaxAge && n != 11 {
		t.Fatalf("within %v of the last reading: memory fits %d, want the shared reading's 11", hostMaxAge, n)
	}
	time.Sleep(hostMaxAge)
	if n := memFits(); n != 3 {
		t.Fatalf("after %v: memory fits %d, want 3 from a new reading", hostMaxAge, n)
	}
}

func TestAdmissionBadMeminfo(t *testing.T) {
	a := testAdmission(t, 1024, 512, 2, 4)
	if err := os.WriteFile(a.meminfo, []byte("MemTotal: lots\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := a.Admit(context.Background(), node.SandboxSpec{ID: "x", CPU: 1, MemoryBytes: 1 << 20})
	if err == nil || errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "measure node") {
		t.Fatalf("an unreadable meminfo must fail admission as an error, not a refusal: %v", err)
	}
}

func TestPidsOfHost(t *testing.T) {
	limit, used := pidsOfHost()
	if limit <= 0 || used <= 0 || used > limit {
		t.Fatalf("pids limit %d used %d", limit, used)
	}
}

type versionOnly struct{ cgroups.Manager }

func (versionOnly) Version() int { return 2 }

func TestEfficiencyBadFlags(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, o := range []serveOptions{
		{swap: "zram:1", overcommit: 4},
		{swap: "disk:4G", overcommit: 4},
		{swap: "zram:", overcommit: 4},
		{reclaimIdle: -time.Second, overcommit: 4},
		{overcommit: 0},
		{overcommit: -2},
		{overcommit: 4, memReserve: "lots"},
	} {
		e, err := newEfficiency(context.Background(), &o, versionOnly{}, log)
		if err == nil {
			e.Close()
			t.Errorf("%+v accepted", o)
			continue
		}
		var u usageError
		if !errors.As(err, &u) {
			t.Errorf("%+v: want a usage error, got %v", o, err)
		}
	}
}

type fakeResidents []node.Resident

func (f *fakeResidents) EachResident(fn func(node.Resident)) {
	for _, r := range *f {
		fn(r)
	}
}

func (f *fakeResidents) Resident(id string) (node.Resident, bool) {
	for _, r := range *f {
		if r.ID == id {
			return r, true
		}
	}
	return node.Resident{}, false
}

// A pending admission stops counting once its sandbox runs; from then on
// the sandbox counts with its request until measured, then with its p95.
func TestAdmissionPendingToMeasured(t *testing.T) {
	ctx := context.Background()
	a := testAdmission(t, 8192, 8192, 2, 2) // cpu capacity 4
	res := &fakeResidents{}
	a.agent = res
	spec := node.SandboxSpec{ID: "one", CPU: 1.5, MemoryBytes: 64 << 20}
	if err := a.Admit(ctx, spec); err != nil {
		t.Fatal(err)
	}
	cpuFits := func() int {
		t.Helper()
		c, err := a.Capacity(ctx, node.SandboxSpec{CPU: 1, MemoryBytes: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		return c.Detail[scheduler.ResourceCPU]
	}
	if n := cpuFits(); n != 2 { // 4 - 1.5 pending
		t.Fatalf("cpu fits %d with one pending 1.5-core admission, want 2", n)
	}
	*res = fakeResidents{{ID: "one", State: node.StateCreating, CPU: 1.5}}
	if n := cpuFits(); n != 2 || len(a.pending) != 1 {
		t.Fatalf("while creating: cpu fits %d, pending %d", n, len(a.pending))
	}
	*res = fakeResidents{{ID: "one", State: node.StateRunning, CPU: 1.5}}
	if n := cpuFits(); n != 2 || len(a.pending) != 0 {
		t.Fatalf("running, unmeasured: cpu fits %d (want its request counted once), pending %d", n, len(a.pending))
	}
	// Measured at about 0.18 cores (0.2 s of CPU per 1.1 s).
	for i := 0; i < 3; i++ {
		a.stats.Observe("one", &cgroups.Stats{CPUUsageNanos: uint64(i) * 2e8})
		time.Sleep(1100 * time.Millisecond)
	}
	if n := cpuFits(); n != 3 {
		t.Fatalf("measured at ~0.2 cores: cpu fits %d, want 3", n)
	}
}

// With enough measured sandboxes, one not measured yet (and a newcomer)
// is expected to use what they use on average, not its whole request.
func TestAdmissionExpectsMeasuredAverage(t *testing.T) {
	ctx := context.Background()
	a := testAdmission(t, 8192, 8192, 2, 2) // cpu capacity 4; policy fraction 1
	res := fakeResidents{{ID: "new", State: node.StateRunning, CPU: 1}}
	for i := 0; i < minMeasuredForAverage; i++ {
		res = append(res, node.Resident{ID: fmt.Sprintf("m%d", i), State: node.StateRunning, CPU: 1})
	}
	a.agent = &res
	cpuFits := func() int {
		t.Helper()
		c, err := a.Capacity(ctx, node.SandboxSpec{CPU: 1, MemoryBytes: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		return c.Detail[scheduler.ResourceCPU]
	}
	// Nothing measured: every request counts whole (4 - 6 < 0).
	if n := cpuFits(); n != 0 {
		t.Fatalf("unmeasured: cpu fits %d, want 0", n)
	}
	// The five measured at ~0.02 cores each.
	for step := uint64(0); step < 2; step++ {
		for i := 0; i < minMeasuredForAverage; i++ {
			a.stats.ObserveCPU(fmt.Sprintf("m%d", i), step*22e6)
		}
		if step == 0 {
			time.Sleep(1100 * time.Millisecond)
		}
	}
	// 5 x 0.02 measured + 0.02 expected for "new" leaves ~3.88 cores for
	// newcomers expected at 0.02 each.
	if n := cpuFits(); n < 150 || n > 200 {
		t.Fatalf("measured average ~0.02: cpu fits %d, want about 190", n)
	}
}

// walkUsage is admission's CPU and sandbox count as it was computed
// before the node kept sums: a walk over every resident. It decides on a
// copy of the pending admissions as usage does on the real ones.
func walkUsage(a *admission, res fakeResidents, pending map[string]pendingAdmission) scheduler.NodeUsage {
	var u scheduler.NodeUsage
	listed := map[string]string{}
	var unmeasured []float64
	var measuredSum float64
	measured := 0
	for _, sb := range res {
		if _, ok := pending[sb.ID]; ok {
			listed[sb.ID] = sb.State
		}
		if sb.State != node.StateRunning && sb.State != node.StatePaused {
			continue
		}
		u.Sandboxes++
		if c := a.stats.CPU(sb.ID); c.Samples >= 2 {
			u.CPUUsedP95 += c.P95
			measuredSum += c.P95
			measured++
		} else {
			unmeasured = append(unmeasured, sb.CPU)
		}
	}
	expected := func(request float64) float64 {
		if measured < minMeasuredForAverage {
			return request * a.policy.ExpectedCPUFraction
		}
		return min(request, max(measuredSum/float64(measured), minExpectedCPU))
	}
	for _, req := range unmeasured {
		u.CPUUsedP95 += expected(req)
	}
	now := time.Now()
	for id, p := range pending {
		st, ok := listed[id]
		switch {
		case ok && st != node.StateCreating:
			delete(pending, id)
			continue
		case ok:
			p.seen = true
			pending[id] = p
		case p.seen || now.Sub(p.at) > pendingTTL:
			delete(pending, id)
			continue
		}
		u.CPUUsedP95 += p.cpu
		u.MemoryHeld += p.mem
		u.Sandboxes++
	}
	return u
}

// sumsAdmission is an admission over fake residents whose sampler takes
// readings of any spacing (the tests feed it without sleeping).
func sumsAdmission(t *testing.T) (*admission, *fakeResidents) {
	t.Helper()
	a := testAdmission(t, 1<<20, 1<<20, 64, 4)
	var err error
	if a.stats, err = node.NewStatsSampler(1, time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	res := &fakeResidents{}
	a.agent = res
	return a, res
}

// usageNow is admission's usage less the host's figures. a.mu taken.
func usageNow(a *admission) scheduler.NodeUsage {
	a.mu.Lock()
	defer a.mu.Unlock()
	u := a.usage(hostReading{})
	return scheduler.NodeUsage{CPUUsedP95: u.CPUUsedP95, MemoryHeld: u.MemoryHeld, Sandboxes: u.Sandboxes}
}

func setState(res *fakeResidents, id, state string) {
	for i := range *res {
		if (*res)[i].ID == id {
			(*res)[i].State = state
		}
	}
}

// A sandbox's life as admission counts it from the kept sums: pending,
// then its request once running (never both, never neither), its p95
// once measured, nothing once dead or deleted.
func TestAdmissionSumsLifecycle(t *testing.T) {
	a, res := sumsAdmission(t)
	// A listing taken before "b" ran, applied after an admission saw it
	// run (the stats loop racing a create).
	var gen uint64
	var listing fakeResidents
	sync := func(gen uint64, listing fakeResidents) {
		live := map[string]bool{}
		for _, sb := range listing {
			live[sb.ID] = sb.State == node.StateRunning || sb.State == node.StatePaused
		}
		syncTracked(a.stats, res, gen, listing, live)
	}
	usage := uint64(0)
	steps := []struct {
		name    string
		do      func()
		cpu     float64
		sbs     int
		pending int
	}{
		{"admitted, not listed yet", func() {
			a.pending["a"] = pendingAdmission{at: time.Now(), cpu: 1, mem: 1 << 20}
		}, 1, 1, 1},
		{"creating", func() { *res = append(*res, node.Resident{ID: "a", State: node.StateCreating, CPU: 2}) }, 1, 1, 1},
		{"running: its request, no longer pending", func() { setState(res, "a", node.StateRunning) }, 2, 1, 0},
		{"paused counts the same", func() { setState(res, "a", node.StatePaused) }, 2, 1, 0},
		{"measured", func() {
			setState(res, "a", node.StateRunning)
			a.stats.ObserveCPU("a", 0)
			time.Sleep(10 * time.Millisecond)
			usage = uint64(5 * time.Millisecond) // ~0.5 cores
			a.stats.ObserveCPU("a", usage)
		}, -1, 1, 0},
		{"b admitted and creating; a listing taken now", func() {
			a.pending["b"] = pendingAdmission{at: time.Now(), cpu: 1, mem: 1 << 20}
			*res = append(*res, node.Resident{ID: "b", State: node.StateCreating, CPU: 1})
			gen = a.stats.TrackGen()
			listing = append(fakeResidents{}, *res...)
		}, -2, 2, 1},
		{"b runs: its request", func() { setState(res, "b", node.StateRunning) }, -2, 2, 0},
		{"the listing from before b ran does not drop it", func() { sync(gen, listing) }, -2, 2, 0},
		{"a dies: counted until the stats loop sees it", func() { setState(res, "a", node.StateDead) }, -2, 2, 0},
		{"the stats loop saw it dead", func() { sync(a.stats.TrackGen(), *res) }, 1, 1, 0},
		{"b deleted", func() {
			*res = fakeResidents{{ID: "a", State: node.StateDead, CPU: 2}}
			a.stats.Forget("b") // as node.Local's destroy does
		}, 0, 0, 0},
		{"a create that fails: pending until its sandbox is gone", func() {
			a.pending["c"] = pendingAdmission{at: time.Now(), cpu: 0.5, mem: 1 << 20}
			*res = append(*res, node.Resident{ID: "c", State: node.StateCreating, CPU: 0.5})
		}, 0.5, 1, 1},
		{"gone", func() { *res = (*res)[:1] }, 0, 0, 0},
	}
	for _, st := range steps {
		st.do()
		got := usageNow(a)
		want := st.cpu
		switch st.cpu {
		case -1: // a's p95
			want = a.stats.CPU("a").P95
		case -2: // a's p95 and b's request or pending 1 core
			want = a.stats.CPU("a").P95 + 1
		}
		if math.Abs(got.CPUUsedP95-want) > 1e-6 || got.Sandboxes != st.sbs || len(a.pending) != st.pending {
			t.Fatalf("%s: cpu %v sandboxes %d pending %d; want %v, %d, %d", st.name, got.CPUUsedP95, got.Sandboxes, len(a.pending), want, st.sbs, st.pending)
		}
		if got.MemoryHeld != int64(st.pending)<<20 {
			t.Fatalf("%s: pending memory %d, want %d", st.name, got.MemoryHeld, int64(st.pending)<<20)
		}
	}
}

// Random creates, state changes, samples, deletes and stats passes (some
// with a listing taken before the step before): admission from the kept
// sums counts the same as the walk over every sandbox did after a stats
// pass with a fresh listing, and never less in between, except while a
// sandbox that died or is being deleted is still tracked: from its death
// to the next stats pass (<= 1 s), from the start of its delete to the
// Forget at its end. Then it still counts as before (more sandboxes), but
// its p95 also stays in the measured average that sets unmeasured
// sandboxes' expected use, and a low one can make that sum lower.
func TestAdmissionSumsMatchWalk(t *testing.T) {
	a, res := sumsAdmission(t)
	rng := rand.New(rand.NewPCG(3, 4))
	usage := map[string]uint64{}
	requests := []float64{0.5, 1, 2}
	next := 0
	var staleGen uint64
	var stale fakeResidents
	sync := func(gen uint64, listing fakeResidents) {
		live := map[string]bool{}
		for _, sb := range listing {
			live[sb.ID] = sb.State == node.StateRunning || sb.State == node.StatePaused
		}
		syncTracked(a.stats, res, gen, listing, live)
	}
	left := false // a sandbox died or was deleted since the last stats pass
	compare := func(step int, what string, exact bool) {
		t.Helper()
		a.mu.Lock()
		pend := maps.Clone(a.pending)
		want := walkUsage(a, *res, pend)
		a.mu.Unlock()
		got := usageNow(a)
		if !maps.EqualFunc(pend, a.pending, func(x, y pendingAdmission) bool { return x.seen == y.seen }) {
			t.Fatalf("step %d (%s): pending %v, the walk keeps %v", step, what, a.pending, pend)
		}
		if got.MemoryHeld != want.MemoryHeld || got.Sandboxes < want.Sandboxes || !left && got.CPUUsedP95 < want.CPUUsedP95-1e-9 ||
			exact && (got.Sandboxes != want.Sandboxes || math.Abs(got.CPUUsedP95-want.CPUUsedP95) > 1e-6) {
			t.Fatalf("step %d (%s): sums %+v, walk %+v", step, what, got, want)
		}
	}
	pick := func(states ...string) (int, bool) {
		var idx []int
		for i, sb := range *res {
			if slices.Contains(states, sb.State) {
				idx = append(idx, i)
			}
		}
		if len(idx) == 0 {
			return 0, false
		}
		return idx[rng.IntN(len(idx))], true
	}
	for step := 0; step < 3000; step++ {
		what := ""
		switch op := rng.IntN(12); op {
		case 0, 1: // admitted; listed as creating at once or later
			id := fmt.Sprintf("s%d", next)
			next++
			a.mu.Lock()
			a.pending[id] = pendingAdmission{at: time.Now(), cpu: 0.1, mem: 1 << 20}
			a.mu.Unlock()
			if op == 0 {
				*res = append(*res, node.Resident{ID: id, State: node.StateCreating, CPU: requests[rng.IntN(len(requests))]})
			}
			what = "admit " + id
		case 2: // an admitted sandbox listed
			for id := range a.pending {
				if _, ok := res.Resident(id); !ok {
					*res = append(*res, node.Resident{ID: id, State: node.StateCreating, CPU: requests[rng.IntN(len(requests))]})
					what = "listed " + id
					break
				}
			}
		case 3, 4:
			if i, ok := pick(node.StateCreating); ok {
				(*res)[i].State = node.StateRunning
				what = "running " + (*res)[i].ID
			}
		case 5:
			if i, ok := pick(node.StateRunning, node.StatePaused); ok {
				(*res)[i].State = map[string]string{node.StateRunning: node.StatePaused, node.StatePaused: node.StateRunning}[(*res)[i].State]
				what = "pause/resume " + (*res)[i].ID
			}
		case 6:
			if i, ok := pick(node.StateRunning, node.StatePaused); ok {
				(*res)[i].State = node.StateDead
				what = "dead " + (*res)[i].ID
				left = true
			}
		case 7: // deleted (a failed create, a dead or a live sandbox)
			if i, ok := pick(node.StateCreating, node.StateRunning, node.StatePaused, node.StateDead); ok {
				id := (*res)[i].ID
				// A delete publishes its state first, forgets the
				// sandbox's CPU last: in between it still counts.
				(*res)[i].State = node.StateDeleted
				left = true
				compare(step, "deleting "+id, false)
				*res = slices.Delete(*res, i, i+1)
				a.stats.Forget(id)
				what = "deleted " + id
				left = true
			}
		case 8, 9: // a sample of a live sandbox
			if i, ok := pick(node.StateRunning, node.StatePaused); ok {
				id := (*res)[i].ID
				usage[id] += uint64(rng.IntN(2000))
				a.stats.ObserveCPU(id, usage[id])
				what = "sample " + id
			}
		case 10: // a stats pass with a listing taken a step ago
			if stale != nil {
				sync(staleGen, stale)
				what = "stale stats pass"
			}
			staleGen = a.stats.TrackGen()
			stale = append(fakeResidents{}, *res...)
		case 11:
			sync(a.stats.TrackGen(), append(fakeResidents{}, *res...))
			left = false
			compare(step, "stats pass", true)
			continue
		}
		compare(step, what, false)
	}
}

// A sandbox seen running is tracked only if it still is once tracked: a
// delete that forgot it in between must not leave it counted.
func TestAdmissionTrackRechecks(t *testing.T) {
	a, res := sumsAdmission(t)
	*res = fakeResidents{{ID: "a", State: node.StateRunning, CPU: 1}, {ID: "d", State: node.StateDeleted, CPU: 1}}
	track(a.stats, res, node.Resident{ID: "a", State: node.StateRunning, CPU: 1})
	track(a.stats, res, node.Resident{ID: "d", State: node.StateRunning, CPU: 1}) // seen before its delete began
	track(a.stats, res, node.Resident{ID: "gone", State: node.StateRunning, CPU: 1})
	if !a.stats.Tracked("a") || a.stats.Tracked("d") || a.stats.Tracked("gone") {
		t.Fatalf("tracked a %v, d %v, gone %v; want only a", a.stats.Tracked("a"), a.stats.Tracked("d"), a.stats.Tracked("gone"))
	}
	// A sandbox adopted before the first admission counts from it on.
	b, res := sumsAdmission(t)
	*res = fakeResidents{{ID: "old", State: node.StatePaused, CPU: 2}, {ID: "dead", State: node.StateDead, CPU: 2}}
	if u := usageNow(b); u.Sandboxes != 1 || u.CPUUsedP95 != 2 {
		t.Fatalf("adopted: %+v, want the paused one's 2 cores", u)
	}
}
