package cgroups

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testutil"
)

const sysfsRoot = "/sys/fs/cgroup"

// v1Manager returns a manager on the real v1 hierarchies and a unique
// parent name under which the test creates its groups; the parent is
// removed from every hierarchy at cleanup.
func v1Manager(t testing.TB) (*V1Manager, string) {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresFeature(t, "cgroup v1 memory hierarchy", isDir(filepath.Join(sysfsRoot, "memory")) && !exists(filepath.Join(sysfsRoot, "cgroup.controllers")))
	m, err := NewV1(sysfsRoot)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	parent := "dsec-test-" + hex.EncodeToString(b)
	t.Cleanup(func() {
		for _, root := range m.dirs {
			removeTree(t, filepath.Join(root, parent))
		}
	})
	return m, parent
}

// removeTree rmdirs a cgroup directory tree bottom-up (cgroupfs has no
// recursive removal), killing stragglers first.
func removeTree(t testing.TB, dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.IsDir() {
			removeTree(t, filepath.Join(dir, e.Name()))
		}
	}
	if pids, err := readProcs(dir); err == nil {
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	o := defaultOptions()
	if err := rmdirRetry(ctx, &o, dir); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

func readTrim(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// startIn starts argv and moves it into g; the process is killed and reaped
// at cleanup.
func startIn(t testing.TB, g Group, argv ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	if err := g.AddProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	return cmd
}

func TestV1SetWritesKnobs(t *testing.T) {
	m, parent := v1Manager(t)
	ctx := context.Background()
	tests := []struct {
		name string
		r    Resources
		want map[string]string // "ctrl/file" -> value
	}{
		{
			name: "limits",
			r: Resources{CPUWeight: 50, CPUQuotaMicros: 50000, CPUPeriodMicros: 100000,
				MemoryLimit: 256 << 20, MemoryHigh: 128 << 20, SwapLimit: 64 << 20, PidsLimit: 64},
			want: map[string]string{
				"cpu/cpu.shares": "512", "cpu/cpu.cfs_quota_us": "50000", "cpu/cpu.cfs_period_us": "100000",
				"memory/memory.limit_in_bytes": "268435456", "memory/memory.soft_limit_in_bytes": "134217728",
				"memory/memory.memsw.limit_in_bytes": "335544320", "pids/pids.max": "64",
			},
		},
		{
			name: "defaults",
			r:    Resources{},
			want: map[string]string{
				"cpu/cpu.shares": "1024", "cpu/cpu.cfs_quota_us": "-1", "pids/pids.max": "max",
				"memory/memory.limit_in_bytes": "9223372036854771712",
			},
		},
		{
			name: "tiny weight clamps to 2 shares",
			r:    Resources{CPUWeight: 1},
			want: map[string]string{"cpu/cpu.shares": "10"},
		},
		{
			name: "idle",
			r:    Resources{CPUIdle: true},
			want: map[string]string{"cpu/cpu.idle": "1"},
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name := parent + "/set" + itoa(int64(i))
			g, err := m.New(ctx, name, tc.r)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = g.Delete(ctx) })
			check := func() {
				t.Helper()
				for f, want := range tc.want {
					ctrl, file, _ := strings.Cut(f, "/")
					if got := readTrim(t, filepath.Join(g.Paths()[ctrl], file)); got != want {
						t.Errorf("%s = %q, want %q", f, got, want)
					}
				}
			}
			check() // as created
			if err := g.Set(Resources{CPUWeight: 300, MemoryLimit: 64 << 20, PidsLimit: 5}); err != nil {
				t.Fatal(err)
			}
			if got := readTrim(t, filepath.Join(g.Paths()["cpu"], "cpu.shares")); got != "3072" {
				t.Errorf("after Set: shares %s", got)
			}
			if err := g.Set(tc.r); err != nil { // and back, via Set
				t.Fatal(err)
			}
			check()
		})
	}
}

func TestV1Lifecycle(t *testing.T) {
	m, parent := v1Manager(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g, err := m.New(ctx, parent+"/sb", Resources{MemoryLimit: 128 << 20, PidsLimit: 32})
	if err != nil {
		t.Fatal(err)
	}
	cmd := startIn(t, g, "sleep", "1000")
	pid := cmd.Process.Pid

	procs, err := g.Procs()
	if err != nil || len(procs) != 1 || procs[0] != pid {
		t.Fatalf("Procs = %v, %v; want [%d]", procs, err, pid)
	}
	for c, dir := range g.Paths() {
		b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if !strings.Contains(string(b), itoa(int64(pid))) {
			t.Errorf("pid %d not in %s hierarchy", pid, c)
		}
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// Usage is not checked: v1 does not move a task's existing charges
	// with it (move_charge_at_immigrate=0), and sleep allocates nothing new.
	if st.PidsCurrent != 1 || st.PidsLimit != 32 || st.MemoryLimit != 128<<20 || st.HasPSI {
		t.Errorf("stats %+v", st)
	}

	if err := g.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	if s := readTrim(t, filepath.Join(g.Paths()["freezer"], "freezer.state")); s != "FROZEN" {
		t.Errorf("after Freeze: %s", s)
	}
	if err := g.Thaw(ctx); err != nil {
		t.Fatal(err)
	}
	if s := readTrim(t, filepath.Join(g.Paths()["freezer"], "freezer.state")); s != "THAWED" {
		t.Errorf("after Thaw: %s", s)
	}

	// Delete of a populated group fails (EBUSY until ctx ends), loses nothing.
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	err = g.Delete(short)
	cancelShort()
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Errorf("Delete populated: %v, want deadline exceeded", err)
	}
	if p, _ := g.Procs(); len(p) != 1 {
		t.Errorf("Delete populated lost the process: %v", p)
	}

	if err := g.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil || !strings.Contains(cmd.ProcessState.String(), "killed") {
		t.Errorf("process after Kill: %v %v", err, cmd.ProcessState)
	}
	if err := g.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	for c, dir := range g.Paths() {
		if exists(dir) {
			t.Errorf("%s dir %s still exists", c, dir)
		}
	}
	if _, err := m.Load(ctx, parent+"/sb"); !errdefs.IsNotFound(err) {
		t.Errorf("Load after Delete: %v", err)
	}
}

// A shell that forks continuously must still be killed completely.
func TestV1KillForkingProcess(t *testing.T) {
	m, parent := v1Manager(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g, err := m.New(ctx, parent+"/forker", Resources{PidsLimit: 200})
	if err != nil {
		t.Fatal(err)
	}
	startIn(t, g, "sh", "-c", "while :; do sleep 30 & done")
	deadline := time.Now().Add(5 * time.Second)
	for {
		p, _ := g.Procs()
		if len(p) >= 10 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := g.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if p, _ := g.Procs(); len(p) != 0 {
		t.Fatalf("procs left after Kill: %v", p)
	}
	if err := g.Delete(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestV1Errors(t *testing.T) {
	m, parent := v1Manager(t)
	ctx := context.Background()
	g, err := m.New(ctx, parent+"/dup", Resources{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Delete(ctx) })
	tests := []struct {
		name string
		do   func() error
		is   error
	}{
		{"exists", func() error { _, err := m.New(ctx, parent+"/dup", Resources{}); return err }, errdefs.ErrAlreadyExists},
		{"missing", func() error { _, err := m.Load(ctx, parent+"/nope"); return err }, errdefs.ErrNotFound},
		{"absolute name", func() error { _, err := m.New(ctx, "/abs", Resources{}); return err }, errdefs.ErrInvalidArgument},
		{"dotdot name", func() error { _, err := m.New(ctx, parent+"/../x", Resources{}); return err }, errdefs.ErrInvalidArgument},
		{"empty name", func() error { _, err := m.Load(ctx, ""); return err }, errdefs.ErrInvalidArgument},
		{"weight", func() error { return g.Set(Resources{CPUWeight: 10001}) }, errdefs.ErrInvalidArgument},
		{"quota", func() error { return g.Set(Resources{CPUQuotaMicros: 10}) }, errdefs.ErrInvalidArgument},
		{"period", func() error { return g.Set(Resources{CPUPeriodMicros: 10}) }, errdefs.ErrInvalidArgument},
		{"negative memory", func() error { return g.Set(Resources{MemoryLimit: -5}) }, errdefs.ErrInvalidArgument},
		{"bad pid", func() error { return g.AddProc(-1) }, errdefs.ErrInvalidArgument},
		{"reclaim zero", func() error { return g.(Reclaimer).Reclaim(0) }, errdefs.ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.do(); !errors.Is(err, tc.is) {
				t.Fatalf("got %v, want %v", err, tc.is)
			}
		})
	}
	// A New the kernel refuses (v1: a child's CFS quota may not exceed its
	// parent's) is rolled back in every hierarchy.
	capped, err := m.New(ctx, parent+"/capped", Resources{CPUQuotaMicros: 10000, CPUPeriodMicros: 100000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = capped.Delete(ctx) })
	if _, err := m.New(ctx, parent+"/capped/child", Resources{CPUQuotaMicros: 50000, CPUPeriodMicros: 100000}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("child quota above parent: %v, want invalid argument", err)
	}
	for _, root := range m.dirs {
		if exists(filepath.Join(root, parent, "capped", "child")) {
			t.Errorf("refused New left %s", filepath.Join(root, parent, "capped", "child"))
		}
	}
	// Resources are unchanged after rejected Sets.
	if got := readTrim(t, filepath.Join(g.Paths()["cpu"], "cpu.shares")); got != "1024" {
		t.Errorf("shares changed by rejected Set: %s", got)
	}
}

// Reclaim on v1 drops page cache charged to the group, restores the limit
// and the OOM setting, and never kills the group's process.
func TestV1Reclaim(t *testing.T) {
	m, parent := v1Manager(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := m.New(ctx, parent+"/rec", Resources{MemoryLimit: 512 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Kill(ctx); _ = g.Delete(ctx) })
	// Page cache is charged to the cgroup of the reader: a shell in the
	// group reads a 32 MiB file from disk (not tmpfs), then sleeps.
	dir, err := os.MkdirTemp("/var/tmp", "dsec-cg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := filepath.Join(dir, "data")
	if err := os.WriteFile(f, make([]byte, 32<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	// Drop the file's pages so the reader in the group faults them in
	// and gets charged (the writer's charge went to the test's group).
	dropCache(t, f)
	cmd := exec.Command("sh", "-c", "read x; cat "+f+" >/dev/null; echo read; exec sleep 1000")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := g.AddProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	// Only now, inside the group, the shell reads the file.
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(stdout).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	// Most of the file, not all: pages fadvise could not drop (still in
	// another CPU's LRU batch) stay charged to the writer, and this host's
	// own DAMON pageout may take some.
	waitFor(t, func() bool {
		st, _ := g.Stats()
		return st != nil && st.File >= 28<<20
	})
	before, _ := g.Stats()
	t.Logf("before: usage %d file %d inactive %d active %d", before.MemoryUsage, before.File, before.InactiveFile, before.ActiveFile)
	err = g.(Reclaimer).Reclaim(16 << 20)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := g.Stats()
	if drop := int64(before.MemoryUsage) - int64(after.MemoryUsage); drop < 15<<20 {
		t.Errorf("usage dropped by %d, want >= 15 MiB (before %d after %d)", drop, before.MemoryUsage, after.MemoryUsage)
	}
	if got := readTrim(t, filepath.Join(g.Paths()["memory"], "memory.limit_in_bytes")); got != "536870912" {
		t.Errorf("limit not restored: %s", got)
	}
	oc, _ := readOOMControl(g.Paths()["memory"])
	if oc["oom_kill_disable"] != 0 || oc["oom_kill"] != 0 {
		t.Errorf("oom_control after reclaim: %v", oc)
	}
	if err := syscall.Kill(cmd.Process.Pid, 0); err != nil {
		t.Errorf("process gone after reclaim: %v", err)
	}
}

// dropCache evicts a file's pages with POSIX_FADV_DONTNEED.
func dropCache(t testing.TB, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_ = f.Sync()
	const fadvDontNeed = 4
	if _, _, e := syscall.Syscall6(syscall.SYS_FADVISE64, f.Fd(), 0, 0, fadvDontNeed, 0, 0); e != 0 {
		t.Fatal(e)
	}
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestDetectHost(t *testing.T) {
	testutil.RequiresFeature(t, "cgroupfs at /sys/fs/cgroup", isDir(sysfsRoot))
	m, err := Detect(sysfsRoot)
	if err != nil {
		t.Fatal(err)
	}
	want := 1
	if exists(filepath.Join(sysfsRoot, "cgroup.controllers")) {
		want = 2
	}
	if m.Version() != want {
		t.Fatalf("Detect = v%d, want v%d", m.Version(), want)
	}
}

func BenchmarkV1NewDelete(b *testing.B) {
	m, parent := v1Manager(b)
	ctx := context.Background()
	r := Resources{CPUWeight: 100, MemoryLimit: 512 << 20, PidsLimit: 256}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		g, err := m.New(ctx, parent+"/b"+itoa(int64(i)), r)
		if err != nil {
			b.Fatal(err)
		}
		if err := g.Delete(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkV1Stats(b *testing.B) {
	m, parent := v1Manager(b)
	ctx := context.Background()
	g, err := m.New(ctx, parent+"/stats", Resources{MemoryLimit: 512 << 20})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = g.Delete(ctx) })
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := g.Stats(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkV1FreezeThaw(b *testing.B) {
	m, parent := v1Manager(b)
	ctx := context.Background()
	g, err := m.New(ctx, parent+"/freeze", Resources{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = g.Delete(ctx) })
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := g.Freeze(ctx); err != nil {
			b.Fatal(err)
		}
		if err := g.Thaw(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
