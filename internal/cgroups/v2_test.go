package cgroups

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// fakeKernel stands in for cgroupfs in a plain directory: mkdir populates
// the files the kernel would create, with the values a fresh v2 cgroup
// shows; rmdir removes them.
func fakeKernel(o *options) error {
	o.mkdir = func(dir string) error {
		if err := syscall.Mkdir(dir, 0o755); err != nil {
			return err
		}
		parentOn, _ := os.ReadFile(filepath.Join(filepath.Dir(dir), "cgroup.subtree_control"))
		files := map[string]string{
			"cgroup.controllers":     strings.Join(strings.Fields(strings.ReplaceAll(string(parentOn), "+", "")), " "),
			"cgroup.subtree_control": "",
			"cgroup.procs":           "",
			"cgroup.events":          "populated 0\nfrozen 0\n",
			"cgroup.freeze":          "0",
			"cgroup.kill":            "",
			"cpu.weight":             "100",
			"cpu.max":                "max 100000",
			"cpu.idle":               "0",
			"cpu.stat":               "usage_usec 0\nuser_usec 0\nsystem_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
			"memory.current":         "0",
			"memory.peak":            "0",
			"memory.max":             "max",
			"memory.high":            "max",
			"memory.swap.max":        "max",
			"memory.swap.current":    "0",
			"memory.reclaim":         "",
			"memory.stat":            "anon 0\nfile 0\n",
			"memory.events":          "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
			"pids.max":               "max",
			"pids.current":           "0",
			"cpu.pressure":           "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
			"memory.pressure":        "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
			"io.pressure":            "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
		}
		for f, v := range files {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0o644); err != nil {
				return err
			}
		}
		return nil
	}
	o.rmdir = func(dir string) error {
		if _, err := os.Stat(dir); err != nil {
			return syscall.ENOENT
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs")); len(strings.TrimSpace(string(b))) > 0 {
			return syscall.EBUSY
		}
		return os.RemoveAll(dir)
	}
	o.pollInterval, o.maxPoll = 100*time.Microsecond, time.Millisecond
	return nil
}

// fakeV2Root makes a unified root offering the given controllers.
func fakeV2Root(t *testing.T, controllers string) string {
	t.Helper()
	root := t.TempDir()
	for f, v := range map[string]string{"cgroup.controllers": controllers, "cgroup.subtree_control": "", "cgroup.procs": ""} {
		if err := os.WriteFile(filepath.Join(root, f), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func fakeV2(t *testing.T) (*V2Manager, string) {
	t.Helper()
	root := fakeV2Root(t, "cpuset cpu io memory hugetlb pids rdma misc")
	m, err := NewV2(root, fakeKernel)
	if err != nil {
		t.Fatal(err)
	}
	return m, root
}

// put replaces a file atomically, as the kernel updates a cgroup file: a
// poller must never see it half written.
func put(t *testing.T, dir, file, v string) {
	t.Helper()
	tmp := filepath.Join(dir, "."+file+".tmp")
	if err := os.WriteFile(tmp, []byte(v), 0o644); err != nil {
		t.Error(err)
		return
	}
	if err := os.Rename(tmp, filepath.Join(dir, file)); err != nil {
		t.Error(err)
	}
}

func get(t *testing.T, dir, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestV2NewEnablesControllersAndWritesKnobs(t *testing.T) {
	m, root := fakeV2(t)
	ctx := context.Background()
	g, err := m.New(ctx, "dsec/sandboxes/sb1", Resources{
		CPUWeight: 250, CPUQuotaMicros: 50000, MemoryLimit: 1 << 30, MemoryHigh: 768 << 20, SwapLimit: 256 << 20, PidsLimit: 128,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{root, filepath.Join(root, "dsec"), filepath.Join(root, "dsec/sandboxes")} {
		if got := get(t, dir, "cgroup.subtree_control"); got != "+cpu +memory +pids" {
			t.Errorf("%s subtree_control = %q", dir, got)
		}
	}
	dir := g.Paths()[""]
	want := map[string]string{
		"cpu.weight": "250", "cpu.max": "50000 100000", "cpu.idle": "0", "memory.max": "1073741824",
		"memory.high": "805306368", "memory.swap.max": "268435456", "pids.max": "128",
	}
	for f, v := range want {
		if got := get(t, dir, f); got != v {
			t.Errorf("%s = %q, want %q", f, got, v)
		}
	}
	// A sibling reuses the cached delegation: no second write.
	put(t, filepath.Join(root, "dsec/sandboxes"), "cgroup.subtree_control", "cpu memory pids")
	if _, err := m.New(ctx, "dsec/sandboxes/sb2", Resources{}); err != nil {
		t.Fatal(err)
	}
	if got := get(t, filepath.Join(root, "dsec/sandboxes"), "cgroup.subtree_control"); got != "cpu memory pids" {
		t.Errorf("sibling rewrote subtree_control: %q", got)
	}
	// A fresh group with zero Resources is left at kernel defaults.
	if got := get(t, filepath.Join(root, "dsec/sandboxes/sb2"), "cpu.max"); got != "max 100000" {
		t.Errorf("sb2 cpu.max = %q", got)
	}
	if _, err := m.New(ctx, "dsec/sandboxes/sb1", Resources{}); !errdefs.IsAlreadyExists(err) {
		t.Errorf("duplicate New: %v", err)
	}
	if _, err := m.Load(ctx, "dsec/sandboxes/sb1"); err != nil {
		t.Errorf("Load: %v", err)
	}
	if _, err := m.Load(ctx, "dsec/sandboxes/nope"); !errdefs.IsNotFound(err) {
		t.Errorf("Load missing: %v", err)
	}
}

func TestV2Set(t *testing.T) {
	tests := []struct {
		name string
		r    Resources
		want map[string]string
		is   error
	}{
		{"defaults", Resources{}, map[string]string{
			"cpu.weight": "100", "cpu.max": "max 100000", "cpu.idle": "0", "memory.max": "max",
			"memory.high": "max", "memory.swap.max": "max", "pids.max": "max"}, nil},
		{"batch", Resources{CPUIdle: true, CPUPeriodMicros: 20000, CPUQuotaMicros: 10000}, map[string]string{
			"cpu.idle": "1", "cpu.max": "10000 20000"}, nil},
		{"swap unlimited", Resources{SwapLimit: -1}, map[string]string{"memory.swap.max": "max"}, nil},
		{"weight too big", Resources{CPUWeight: 20000}, nil, errdefs.ErrInvalidArgument},
		{"negative pids", Resources{PidsLimit: -2}, nil, errdefs.ErrInvalidArgument},
		{"swap below -1", Resources{SwapLimit: -2}, nil, errdefs.ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := fakeV2(t)
			g, err := m.New(context.Background(), "g", Resources{CPUWeight: 7, MemoryLimit: 5 << 20, PidsLimit: 3})
			if err != nil {
				t.Fatal(err)
			}
			dir := g.Paths()[""]
			err = g.Set(tc.r)
			if !errors.Is(err, tc.is) {
				t.Fatalf("Set: %v, want %v", err, tc.is)
			}
			if tc.is != nil { // nothing changed
				if got := get(t, dir, "cpu.weight"); got != "7" {
					t.Errorf("rejected Set changed cpu.weight to %q", got)
				}
				return
			}
			for f, v := range tc.want {
				if got := get(t, dir, f); got != v {
					t.Errorf("%s = %q, want %q", f, got, v)
				}
			}
		})
	}
}

func TestV2MissingFeature(t *testing.T) {
	ctx := context.Background()
	t.Run("controller not offered", func(t *testing.T) {
		root := fakeV2Root(t, "cpu pids")
		m, err := NewV2(root, fakeKernel)
		if err != nil {
			t.Fatal(err)
		}
		_, err = m.New(ctx, "a/b", Resources{})
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `"memory"`) {
			t.Fatalf("New without memory controller: %v", err)
		}
		if exists(filepath.Join(root, "a", "b")) {
			t.Error("failed New created the group")
		}
	})
	t.Run("no cpu.idle", func(t *testing.T) {
		m, _ := fakeV2(t)
		g, err := m.New(ctx, "g", Resources{})
		if err != nil {
			t.Fatal(err)
		}
		os.Remove(filepath.Join(g.Paths()[""], "cpu.idle"))
		if err := g.Set(Resources{CPUIdle: true}); !errdefs.IsNotImplemented(err) {
			t.Fatalf("CPUIdle without cpu.idle: %v", err)
		}
	})
	t.Run("no swap accounting", func(t *testing.T) {
		m, _ := fakeV2(t)
		g, err := m.New(ctx, "g", Resources{})
		if err != nil {
			t.Fatal(err)
		}
		os.Remove(filepath.Join(g.Paths()[""], "memory.swap.max"))
		if err := g.Set(Resources{}); err != nil {
			t.Fatalf("Set without swap accounting and no swap limit: %v", err)
		}
		if err := g.Set(Resources{SwapLimit: 1 << 20}); !errdefs.IsNotImplemented(err) {
			t.Fatalf("swap limit without memory.swap.max: %v", err)
		}
	})
	t.Run("not a cgroup2 root", func(t *testing.T) {
		if _, err := NewV2(t.TempDir()); !errdefs.IsFailedPrecondition(err) {
			t.Fatalf("NewV2 on a plain dir: %v", err)
		}
	})
}

const memStat = `anon 52428800
file 33554432
kernel 4194304
kernel_stack 65536
pagetables 262144
sock 0
shmem 1048576
file_mapped 2097152
zswap 1000000
zswapped 4000000
active_anon 10485760
inactive_anon 41943040
active_file 8388608
inactive_file 25165824
slab 3000000
`

func TestV2Stats(t *testing.T) {
	m, _ := fakeV2(t)
	g, err := m.New(context.Background(), "g", Resources{PidsLimit: 50})
	if err != nil {
		t.Fatal(err)
	}
	dir := g.Paths()[""]
	put(t, dir, "cpu.stat", "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\nnr_periods 10\nnr_throttled 3\nthrottled_usec 2500\n")
	put(t, dir, "memory.current", "90000000\n")
	put(t, dir, "memory.max", "max\n")
	put(t, dir, "memory.peak", "95000000\n")
	put(t, dir, "memory.stat", memStat)
	put(t, dir, "memory.swap.current", "7340032\n")
	put(t, dir, "memory.events", "low 0\nhigh 2\nmax 1\noom 1\noom_kill 1\noom_group_kill 0\n")
	put(t, dir, "pids.current", "4\n")
	put(t, dir, "memory.pressure", "some avg10=1.50 avg60=0.75 avg300=0.10 total=123456\nfull avg10=0.50 avg60=0.25 avg300=0.01 total=4567\n")
	put(t, dir, "cpu.pressure", "some avg10=12.00 avg60=3.00 avg300=1.00 total=999\n")

	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	want := Stats{
		CPUUsageNanos: 1500000000, CPUThrottledNanos: 2500000, CPUNrThrottled: 3,
		MemoryUsage: 90000000, MemoryMaxUsage: 95000000,
		Anon: 52428800, File: 33554432, Shmem: 1048576, Kernel: 4194304,
		ActiveAnon: 10485760, InactiveAnon: 41943040, ActiveFile: 8388608, InactiveFile: 25165824,
		Swap: 7340032, OOMKills: 1, Zswap: 1000000, Zswapped: 4000000,
		PidsCurrent: 4, PidsLimit: 50, HasPSI: true,
		CPUPressure:    Pressure{Some: PSI{Avg10: 12, Avg60: 3, Avg300: 1, TotalMicros: 999}},
		MemoryPressure: Pressure{Some: PSI{1.5, 0.75, 0.1, 123456}, Full: PSI{0.5, 0.25, 0.01, 4567}},
	}
	if *st != want {
		t.Fatalf("Stats\n got %+v\nwant %+v", *st, want)
	}

	// Without a "kernel" line (kernels < 5.18) Kernel is the sum of parts.
	put(t, dir, "memory.stat", strings.Replace(memStat, "kernel 4194304\n", "", 1))
	if st, err = g.Stats(); err != nil || st.Kernel != 65536+262144+3000000 {
		t.Errorf("Kernel without kernel line = %d, %v", st.Kernel, err)
	}
	// PSI disabled: files gone; the rest still reads.
	for _, f := range []string{"cpu.pressure", "memory.pressure", "io.pressure"} {
		os.Remove(filepath.Join(dir, f))
	}
	if st, err = g.Stats(); err != nil || st.HasPSI || st.MemoryPressure != (Pressure{}) {
		t.Errorf("without PSI: HasPSI=%v pressure=%+v err=%v", st.HasPSI, st.MemoryPressure, err)
	}
}

func TestV2StatsMalformed(t *testing.T) {
	tests := []struct {
		file, content, mention string
		is                     error
	}{
		{"memory.stat", "anon 12\nfile\n", "memory.stat line 2", errdefs.ErrInvalidArgument},
		{"memory.stat", "anon -5\n", "memory.stat line 1", errdefs.ErrInvalidArgument},
		{"cpu.stat", "usage_usec 1 2\n", "cpu.stat line 1", errdefs.ErrInvalidArgument},
		{"memory.current", "lots\n", "memory.current", errdefs.ErrInvalidArgument},
		{"memory.events", "oom_kill x\n", "memory.events line 1", errdefs.ErrInvalidArgument},
		{"memory.pressure", "some avg10=x avg60=0 avg300=0 total=0\n", "memory.pressure line 1", errdefs.ErrInvalidArgument},
		{"io.pressure", "partial avg10=0 avg60=0 avg300=0 total=0\n", "io.pressure line 1", errdefs.ErrInvalidArgument},
		{"cpu.pressure", "", "empty pressure file", errdefs.ErrInvalidArgument},
		{"pids.current", "", "pids.current", errdefs.ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.file+"/"+tc.content, func(t *testing.T) {
			m, _ := fakeV2(t)
			g, err := m.New(context.Background(), "g", Resources{})
			if err != nil {
				t.Fatal(err)
			}
			put(t, g.Paths()[""], tc.file, tc.content)
			_, err = g.Stats()
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.mention) {
				t.Fatalf("got %v, want %v mentioning %q", err, tc.is, tc.mention)
			}
		})
	}
	t.Run("missing memory.stat", func(t *testing.T) {
		m, _ := fakeV2(t)
		g, _ := m.New(context.Background(), "g", Resources{})
		os.Remove(filepath.Join(g.Paths()[""], "memory.stat"))
		if _, err := g.Stats(); !errdefs.IsNotFound(err) {
			t.Fatalf("got %v, want not found", err)
		}
	})
}

func TestV2FreezeThaw(t *testing.T) {
	ctx := context.Background()
	m, _ := fakeV2(t)
	g, err := m.New(ctx, "g", Resources{})
	if err != nil {
		t.Fatal(err)
	}
	dir := g.Paths()[""]

	// The "kernel" settles after a few polls.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for get(t, dir, "cgroup.freeze") != "1" {
			time.Sleep(100 * time.Microsecond)
		}
		time.Sleep(3 * time.Millisecond)
		put(t, dir, "cgroup.events", "populated 1\nfrozen 1\n")
	}()
	if err := g.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	if get(t, dir, "cgroup.events") != "populated 1\nfrozen 1\n" {
		t.Fatal("Freeze returned before the kernel reported frozen")
	}

	// Thaw that never settles: deadline error.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := g.Thaw(short); !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("Thaw unsettled: %v", err)
	}
	if get(t, dir, "cgroup.freeze") != "0" {
		t.Fatal("Thaw did not write cgroup.freeze=0")
	}

	// Freeze that never settles: error, and the group is thawed again.
	put(t, dir, "cgroup.events", "populated 1\nfrozen 0\n")
	short2, cancel2 := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel2()
	if err := g.Freeze(short2); !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("Freeze unsettled: %v", err)
	}
	if get(t, dir, "cgroup.freeze") != "0" {
		t.Fatal("failed Freeze left cgroup.freeze=1")
	}

	put(t, dir, "cgroup.events", "populated 1\n")
	if err := g.Freeze(ctx); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("events without frozen line: %v", err)
	}
}

func TestV2KillReclaimDelete(t *testing.T) {
	ctx := context.Background()
	m, _ := fakeV2(t)
	g, err := m.New(ctx, "a/g", Resources{})
	if err != nil {
		t.Fatal(err)
	}
	dir := g.Paths()[""]
	put(t, dir, "cgroup.procs", "4242\n4243\n")
	put(t, dir, "cgroup.events", "populated 1\nfrozen 0\n")
	if p, err := g.Procs(); err != nil || len(p) != 2 || p[0] != 4242 {
		t.Fatalf("Procs = %v, %v", p, err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := g.Kill(short); !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("Kill while still populated: %v", err)
	}
	if get(t, dir, "cgroup.kill") != "1" {
		t.Fatal("Kill did not write cgroup.kill")
	}
	short2, cancel2 := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel2()
	if err := g.Delete(short2); !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("Delete of a populated group: %v", err)
	}
	put(t, dir, "cgroup.procs", "")
	put(t, dir, "cgroup.events", "populated 0\nfrozen 0\n")
	if err := g.Kill(ctx); err != nil {
		t.Fatal(err)
	}

	if err := g.(Reclaimer).Reclaim(1 << 20); err != nil {
		t.Fatal(err)
	}
	if got := get(t, dir, "memory.reclaim"); got != "1048576" {
		t.Fatalf("memory.reclaim = %q", got)
	}
	if err := g.(Reclaimer).Reclaim(-1); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Reclaim(-1): %v", err)
	}
	put(t, dir, "cgroup.procs", "12x\n")
	if _, err := g.Procs(); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("malformed cgroup.procs: %v", err)
	}
	put(t, dir, "cgroup.procs", "")

	if err := g.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if exists(dir) {
		t.Fatal("Delete left the directory")
	}
	if err := g.Delete(ctx); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
}

func TestDetectFakeTrees(t *testing.T) {
	mk := func(t *testing.T, files ...string) string {
		root := t.TempDir()
		for _, f := range files {
			p := filepath.Join(root, f)
			if strings.HasSuffix(f, "/") {
				os.MkdirAll(p, 0o755)
				continue
			}
			os.MkdirAll(filepath.Dir(p), 0o755)
			os.WriteFile(p, []byte("hugetlb"), 0o644)
		}
		return root
	}
	v1 := []string{"cpu/", "cpuacct/", "memory/", "pids/", "freezer/"}
	tests := []struct {
		name  string
		files []string
		want  int
		is    error
	}{
		{"pure v2", []string{"cgroup.controllers"}, 2, nil},
		{"v1", v1, 1, nil},
		{"hybrid with hugetlb-only unified", append(v1, "unified/cgroup.controllers"), 1, nil},
		{"v1 missing freezer", []string{"cpu/", "cpuacct/", "memory/", "pids/"}, 0, errdefs.ErrFailedPrecondition},
		{"nothing", nil, 0, errdefs.ErrFailedPrecondition},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Detect(mk(t, tc.files...))
			if !errors.Is(err, tc.is) {
				t.Fatalf("Detect: %v, want %v", err, tc.is)
			}
			if err == nil && m.Version() != tc.want {
				t.Fatalf("Detect = v%d, want v%d", m.Version(), tc.want)
			}
		})
	}
}

func TestParsePressure(t *testing.T) {
	tests := []struct {
		in   string
		want Pressure
		ok   bool
	}{
		{"some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", Pressure{}, true},
		{"some avg10=2.04 avg60=0.75 avg300=0.40 total=157656722\n", Pressure{Some: PSI{2.04, 0.75, 0.40, 157656722}}, true},
		{"some avg10=1 avg60=2 avg300=3\n", Pressure{}, false},
		{"some avg10=1 avg60=2 avg300=3 total=-1\n", Pressure{}, false},
		{"some avg10=1 avg60=2 avg300=3 sum=1\n", Pressure{}, false},
		{"some avg10 avg60=2 avg300=3 total=1\n", Pressure{}, false},
		{"\n", Pressure{}, false},
	}
	for _, tc := range tests {
		got, err := ParsePressure("x.pressure", []byte(tc.in))
		if (err == nil) != tc.ok {
			t.Errorf("%q: err %v, want ok=%v", tc.in, err, tc.ok)
			continue
		}
		if err != nil && !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: error class %v", tc.in, err)
		}
		if tc.ok && got != tc.want {
			t.Errorf("%q: got %+v want %+v", tc.in, got, tc.want)
		}
	}
	if _, err := ReadPressure(filepath.Join(t.TempDir(), "none")); !errdefs.IsNotImplemented(err) {
		t.Errorf("ReadPressure missing file: %v", err)
	}
}

func TestOptions(t *testing.T) {
	if _, err := NewV2(fakeV2Root(t, "cpu"), WithLogger(nil)); !errdefs.IsInvalidArgument(err) {
		t.Errorf("nil logger: %v", err)
	}
	if _, err := NewV2(fakeV2Root(t, "cpu"), WithPollInterval(time.Second, time.Millisecond)); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad poll interval: %v", err)
	}
}

// A knob the kernel lacks fails New, and the half-made group is removed.
func TestV2NewRollsBack(t *testing.T) {
	root := fakeV2Root(t, "cpu memory pids")
	noIdle := func(o *options) error {
		mk := o.mkdir
		o.mkdir = func(dir string) error {
			if err := mk(dir); err != nil {
				return err
			}
			return os.Remove(filepath.Join(dir, "cpu.idle"))
		}
		return nil
	}
	m, err := NewV2(root, fakeKernel, noIdle)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.New(context.Background(), "g", Resources{CPUIdle: true}); !errdefs.IsNotImplemented(err) {
		t.Fatalf("New with CPUIdle and no cpu.idle: %v", err)
	}
	if exists(filepath.Join(root, "g")) {
		t.Fatal("failed New left the group directory")
	}
	if _, err := m.New(context.Background(), "g", Resources{}); err != nil {
		t.Fatalf("New after the failed one: %v", err)
	}
}
