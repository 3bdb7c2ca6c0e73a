package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
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
