package reclaim

import (
	"compress/gzip"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testutil"
)

func TestApplyClass(t *testing.T) {
	base := cgroups.Resources{MemoryLimit: 1 << 30, CPUWeight: 555, CPUIdle: true}
	tests := []struct {
		class  string
		weight uint64
		idle   bool
		ok     bool
	}{
		{ClassLatency, WeightLatency, false, true},
		{ClassStandard, WeightStandard, false, true},
		{"", WeightStandard, false, true},
		{ClassBatch, 0, true, true},
		{"realtime", 0, false, false},
	}
	for _, tc := range tests {
		r, err := ApplyClass(tc.class, base)
		if !tc.ok {
			if !errdefs.IsInvalidArgument(err) || r != base {
				t.Errorf("%q: %v, resources %+v", tc.class, err, r)
			}
			continue
		}
		if err != nil || r.CPUWeight != tc.weight || r.CPUIdle != tc.idle || r.MemoryLimit != base.MemoryLimit {
			t.Errorf("%q: %+v, %v", tc.class, r, err)
		}
	}
}

// Batch then standard on a real v1 group: cpu.idle goes on, then the group
// is back at the kernel defaults, nothing left behind.
func TestClassRoundTripV1(t *testing.T) {
	g := v1Group(t, cgroups.Resources{})
	cpu := g.Paths()["cpu"]
	testutil.RequiresFeature(t, "cpu.idle in the v1 cpu controller (kernel >= 5.15)", isFile(filepath.Join(cpu, "cpu.idle")))
	if NeedsTaskSchedIdle(g) {
		t.Fatal("NeedsTaskSchedIdle with cpu.idle present")
	}
	r, _ := ApplyClass(ClassBatch, cgroups.Resources{})
	if err := g.Set(r); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(readString(t, cpu, "cpu.idle")); got != "1" {
		t.Fatalf("batch: cpu.idle = %s", got)
	}
	r, _ = ApplyClass(ClassLatency, cgroups.Resources{})
	if err := g.Set(r); err != nil {
		t.Fatal(err)
	}
	if idle, shares := strings.TrimSpace(readString(t, cpu, "cpu.idle")), strings.TrimSpace(readString(t, cpu, "cpu.shares")); idle != "0" || shares != "10240" {
		t.Fatalf("latency: idle %s shares %s", idle, shares)
	}
	r, _ = ApplyClass(ClassStandard, cgroups.Resources{})
	if err := g.Set(r); err != nil {
		t.Fatal(err)
	}
	if shares := strings.TrimSpace(readString(t, cpu, "cpu.shares")); shares != "1024" {
		t.Fatalf("standard: shares %s", shares)
	}
}

func TestNeedsTaskSchedIdleFake(t *testing.T) {
	for _, withIdle := range []bool{true, false} {
		root := t.TempDir()
		os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpu memory pids"), 0o644)
		os.Mkdir(filepath.Join(root, "g"), 0o755)
		if withIdle {
			os.WriteFile(filepath.Join(root, "g", "cpu.idle"), []byte("0"), 0o644)
		}
		m, err := cgroups.NewV2(root)
		if err != nil {
			t.Fatal(err)
		}
		g, err := m.Load(context.Background(), "g")
		if err != nil {
			t.Fatal(err)
		}
		if NeedsTaskSchedIdle(g) == withIdle {
			t.Errorf("cpu.idle present=%v: NeedsTaskSchedIdle=%v", withIdle, !withIdle)
		}
	}
}

// Every thread of a multi-threaded process goes SCHED_IDLE, and back.
func TestSetSchedIdle(t *testing.T) {
	testutil.RequiresRoot(t)
	h := startHelper(t, nil)
	policies := func() map[int]uint32 {
		tids, err := threads(h.pid())
		if err != nil {
			t.Fatal(err)
		}
		out := map[int]uint32{}
		for _, tid := range tids {
			if p, err := SchedPolicy(tid); err == nil {
				out[tid] = p
			}
		}
		return out
	}
	if err := SetSchedIdle(h.pid(), true); err != nil {
		t.Fatal(err)
	}
	ps := policies()
	if len(ps) < 2 {
		t.Fatalf("helper has %d threads, want several", len(ps))
	}
	for tid, p := range ps {
		if p != unix.SCHED_IDLE {
			t.Errorf("tid %d policy %d, want SCHED_IDLE", tid, p)
		}
	}
	if err := SetSchedIdle(h.pid(), false); err != nil {
		t.Fatal(err)
	}
	for tid, p := range policies() {
		if p != unix.SCHED_NORMAL {
			t.Errorf("tid %d policy %d after reset, want SCHED_NORMAL", tid, p)
		}
	}
	if err := SetSchedIdle(1<<30, true); !errdefs.IsNotFound(err) {
		t.Errorf("missing pid: %v", err)
	}
}

// Core scheduling: detection must agree with the kernel config, and
// creating a cookie must work exactly when it is available.
func TestSchedCore(t *testing.T) {
	testutil.RequiresRoot(t)
	avail := SchedCoreAvailable()
	if cfg, ok := kernelConfig(t, "CONFIG_SCHED_CORE"); ok && cfg != avail {
		t.Fatalf("SchedCoreAvailable=%v but kernel config says %v", avail, cfg)
	}
	t.Logf("core scheduling available: %v", avail)
	h := startHelper(t, nil)
	err := SchedCoreCreate(h.pid())
	if avail {
		if err != nil {
			t.Fatal(err)
		}
		var cookie uint64
		if err := unix.PrctlArg5Ptr(unix.PR_SCHED_CORE, unix.PR_SCHED_CORE_GET, uintptr(h.pid()), 0, unsafe.Pointer(&cookie)); err != nil || cookie == 0 {
			t.Fatalf("cookie %d, %v", cookie, err)
		}
	} else if !errdefs.IsNotImplemented(err) {
		t.Fatalf("SchedCoreCreate without CONFIG_SCHED_CORE: %v", err)
	}
}

// kernelConfig reads a boolean option from /proc/config.gz.
func kernelConfig(t *testing.T, opt string) (bool, bool) {
	f, err := os.Open("/proc/config.gz")
	if err != nil {
		return false, false
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return false, false
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		return false, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if line == opt+"=y" {
			return true, true
		}
		if line == "# "+opt+" is not set" {
			return false, true
		}
	}
	return false, true
}

func TestKSMDomain(t *testing.T) {
	var d KSMDomain
	steps := []struct {
		op, tenant, sandbox string
		ok                  bool
		holder              string
	}{
		{"claim", "alice", "a1", true, "alice"},
		{"claim", "alice", "a2", true, "alice"},
		{"claim", "bob", "b1", false, "alice"},
		{"release", "", "a1", true, "alice"},
		{"claim", "bob", "b1", false, "alice"},
		{"release", "", "a2", true, ""},
		{"claim", "bob", "b1", true, "bob"},
		{"claim", "", "x", false, "bob"},
		{"claim", "bob", "", false, "bob"},
	}
	for i, s := range steps {
		var err error
		if s.op == "claim" {
			err = d.Claim(s.tenant, s.sandbox)
		} else {
			d.Release(s.sandbox)
		}
		if (err == nil) != s.ok {
			t.Fatalf("step %d %+v: %v", i, s, err)
		}
		if err != nil && !errdefs.IsFailedPrecondition(err) && !errdefs.IsInvalidArgument(err) {
			t.Fatalf("step %d: error class %v", i, err)
		}
		if d.Tenant() != s.holder {
			t.Fatalf("step %d: holder %q, want %q", i, d.Tenant(), s.holder)
		}
	}
}

// The flag set by the process itself before exec survives the exec: the
// exec shim's way of opting a sandbox into KSM.
func TestKSMFlagSurvivesExec(t *testing.T) {
	testutil.RequiresRoot(t)
	if _, err := KSMRun("/sys"); err != nil {
		testutil.RequiresFeature(t, "KSM (CONFIG_KSM)", false)
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	h := startHelper(t, nil, "MERGE=1", "EXEC="+sleep)
	waitUntil(t, "helper execs sleep", 10*time.Second, func() bool {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(h.pid()) + "/comm")
		return strings.TrimSpace(string(b)) == "sleep"
	})
	st, err := ReadKSMStat(h.pid())
	if err != nil {
		t.Fatal(err)
	}
	if !st.MergeAny {
		t.Fatalf("ksm_merge_any lost across exec: %+v", st)
	}
}

// Identical pages of an opted-in process get merged once ksmd runs; ksmd's
// settings are restored afterwards.
func TestKSMMerges(t *testing.T) {
	testutil.RequiresRoot(t)
	old, err := KSMRun("/sys")
	if err != nil {
		testutil.RequiresFeature(t, "KSM (CONFIG_KSM)", false)
	}
	ksm := "/sys/kernel/mm/ksm"
	oldScan := strings.TrimSpace(readString(t, ksm, "pages_to_scan"))
	h := startHelper(t, nil, "MERGE=1", "SAME=1", "ALLOC_MIB=16")
	t.Cleanup(func() {
		// Stop the helper first so nothing stays merged, then put ksmd
		// back as it was.
		_ = h.cmd.Process.Kill()
		_ = h.cmd.Wait()
		if _, err := SetKSMRun("/sys", old); err != nil {
			t.Errorf("restore ksm run: %v", err)
		}
		if err := writeSys(ksm, "pages_to_scan", oldScan); err != nil {
			t.Errorf("restore pages_to_scan: %v", err)
		}
	})
	if err := writeSys(ksm, "pages_to_scan", "4096"); err != nil {
		t.Fatal(err)
	}
	if _, err := SetKSMRun("/sys", "1"); err != nil {
		t.Fatal(err)
	}
	if _, err := SetKSMRun("/sys", "7"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad run value: %v", err)
	}
	var st KSMStat
	waitUntil(t, "pages merged", 30*time.Second, func() bool {
		st, _ = ReadKSMStat(h.pid())
		return st.MergingPages >= 2048 // of 4096 identical pages
	})
	t.Logf("ksm: %+v", st)
	h.send(t, "check")
	h.expect(t, "ok")
}
