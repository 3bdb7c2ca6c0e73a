package runtime_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/rootfs"
	"github.com/dsec-dev/dsec/internal/runtime"
	"github.com/dsec-dev/dsec/internal/testutil"
)

func TestForkBombIsContained(t *testing.T) {
	e := newEnv(t)
	e.create("bomb", func(s *runtime.Spec) { s.Resources.PidsLimit = 64 })
	e.create("bystander")
	done := make(chan *result, 1)
	go func() {
		// The bomb runs in a background subshell, forked before any pid
		// is taken: busybox sh forks each part of `f | f &` itself, and a
		// non-interactive shell whose fork fails exits, so a bomb started
		// by the exec's own shell ended it early now and then, before its
		// timeout. The shell then becomes a sleep that outlasts it.
		r, err := e.run("bomb", runtime.Process{Args: []string{"sh", "-c", "(f(){ f | f & }; f) & exec sleep 30"}, Timeout: 2 * time.Second}, "")
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	time.Sleep(500 * time.Millisecond)
	// Another sandbox keeps working while the bomb runs.
	if out := e.mustSh("bystander", "echo fine"); out != "fine\n" {
		t.Fatalf("bystander: %q", out)
	}
	st, err := e.rt.Stats("bomb")
	if err != nil {
		t.Fatal(err)
	}
	if st.PidsCurrent > 64 {
		t.Fatalf("pids.current %d above the limit", st.PidsCurrent)
	}
	r := <-done
	if r == nil || !r.TimedOut {
		t.Fatalf("bomb result %+v", r)
	}
	// The bomb's processes may have left the process group; the sandbox
	// must become usable again once they are gone.
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := e.run("bomb", runtime.Process{Args: []string{"sh", "-c", "kill -9 -1; echo ok"}}, "")
		if err == nil && r.stdout == "ok\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox not usable after the bomb: %v %+v", err, r)
		}
		if err != nil && !errdefs.IsResourceExhausted(err) {
			t.Logf("exec during bomb: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !e.rt.Alive("bomb") {
		t.Fatal("init died")
	}
	e.mustSh("bomb", "true")
}

func TestMemoryBombIsOOMKilledInside(t *testing.T) {
	e := newEnv(t)
	e.create("membomb", func(s *runtime.Spec) {
		s.Resources.MemoryLimit = 48 << 20
		// One page: no swap to escape to when the host has some (0 means
		// unlimited in cgroups.Resources).
		s.Resources.SwapLimit = 4096
	})
	e.create("membystander")
	r, err := e.run("membomb", runtime.Process{Args: []string{"tail", "/dev/zero"}, Timeout: 60 * time.Second}, "")
	if err != nil {
		t.Fatal(err)
	}
	if r.Signal != "SIGKILL" || r.TimedOut {
		t.Fatalf("memory bomb: %+v", r.ExecResult)
	}
	if !e.rt.Alive("membomb") {
		t.Fatal("init was killed by the OOM killer")
	}
	st, err := e.rt.Stats("membomb")
	if err != nil {
		t.Fatal(err)
	}
	if st.OOMKills == 0 {
		t.Fatalf("stats report no OOM kill (%+v)", st)
	}
	if out := e.mustSh("membomb", "echo alive"); out != "alive\n" {
		t.Fatalf("%q", out)
	}
	if out := e.mustSh("membystander", "echo alive"); out != "alive\n" {
		t.Fatalf("%q", out)
	}
}

func newDiskPool(t *testing.T) *rootfs.DiskPool {
	t.Helper()
	testutil.RequiresRoot(t)
	_, err := os.Stat("/dev/loop-control")
	testutil.RequiresFeature(t, "loop devices (/dev/loop-control)", err == nil)
	dir, err := os.MkdirTemp("", "dsec-pool-")
	if err != nil {
		t.Fatal(err)
	}
	p, err := rootfs.NewDiskPool(filepath.Join(dir, "pool"), rootfs.WithPoolTarget(2))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(); os.RemoveAll(dir) })
	return p
}

// loopsBackedBy lists loop devices whose backing file is under dir.
func loopsBackedBy(dir string) []string {
	var out []string
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if strings.HasPrefix(strings.TrimSpace(string(b)), dir) {
			out = append(out, f)
		}
	}
	return out
}

func TestDiskLimit(t *testing.T) {
	pool := newDiskPool(t)
	e := newEnv(t, runtime.WithDiskPool(pool))
	const size = 32 << 20
	st := e.create("disk1", func(s *runtime.Spec) { s.DiskBytes = size })
	e.create("disk2", func(s *runtime.Spec) { s.DiskBytes = size })
	e.create("nodisk")
	if got := loopsBackedBy(e.base); len(got) != 2 {
		t.Fatalf("want 2 loop devices for the two disks, got %v", got)
	}
	r := e.sh("disk1", "dd if=/dev/zero of=/big bs=1M count=64 2>&1; sync")
	if r.ExitCode == 0 && !strings.Contains(r.stdout, "No space left") {
		t.Fatalf("writing 64 MiB into a 32 MiB disk: %+v %q", r.ExecResult, r.stdout)
	}
	if !strings.Contains(r.stdout, "No space left") {
		t.Fatalf("want ENOSPC, got %q", r.stdout)
	}
	// The other sandboxes are unaffected.
	e.mustSh("disk2", "dd if=/dev/zero of=/f bs=1M count=16 2>/dev/null && sync && test $(wc -c < /f) = 16777216")
	e.mustSh("nodisk", "dd if=/dev/zero of=/f bs=1M count=40 2>/dev/null && test $(wc -c < /f) = 41943040")
	// The init's handle on the disk root is out of the sandbox's reach.
	if out := e.mustSh("disk1", "ls /proc/1/fd/3/ >/dev/null 2>&1 || echo denied"); out != "denied\n" {
		t.Fatalf("init's disk fd reachable: %q", out)
	}
	// The sandbox itself still works after filling its disk, and can free space.
	e.mustSh("disk1", "rm /big && echo ok > /small && cat /small")
	// The upper is reachable from the host through the init.
	upper, err := e.rt.UpperDir("disk1")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(upper, "small")); err != nil || string(b) != "ok\n" {
		t.Fatalf("upper on disk: %q %v", b, err)
	}
	paths := e.groupPaths(st)
	if err := e.rt.Destroy(context.Background(), "disk1"); err != nil {
		t.Fatal(err)
	}
	e.assertGone(st, paths)
	deadline := time.Now().Add(5 * time.Second)
	for len(loopsBackedBy(st.Dir)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("loop device of a destroyed sandbox still attached: %v", loopsBackedBy(st.Dir))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCreateInvalid(t *testing.T) {
	e := newEnv(t)
	e.create("dup")
	ctx := context.Background()
	notNS, _ := os.CreateTemp(e.base, "notns")
	notNS.Close()
	tests := []struct {
		name  string
		mod   func(*runtime.Spec)
		class error
	}{
		{"empty id", func(s *runtime.Spec) { s.ID = "" }, errdefs.ErrInvalidArgument},
		{"id with slash", func(s *runtime.Spec) { s.ID = "a/b" }, errdefs.ErrInvalidArgument},
		{"id too long", func(s *runtime.Spec) { s.ID = strings.Repeat("a", 64) }, errdefs.ErrInvalidArgument},
		{"bad hostname", func(s *runtime.Spec) { s.Hostname = "a b" }, errdefs.ErrInvalidArgument},
		{"relative dir", func(s *runtime.Spec) { s.Dir = "rel/dir" }, errdefs.ErrInvalidArgument},
		{"no lower", func(s *runtime.Spec) { s.Lower = nil }, errdefs.ErrInvalidArgument},
		{"missing lower", func(s *runtime.Spec) { s.Lower = []string{"/nonexistent/layer"} }, errdefs.ErrInvalidArgument},
		{"relative lower", func(s *runtime.Spec) { s.Lower = []string{"layer"} }, errdefs.ErrInvalidArgument},
		{"lower is a file", func(s *runtime.Spec) { s.Lower = []string{notNS.Name()} }, errdefs.ErrInvalidArgument},
		{"bad env", func(s *runtime.Spec) { s.Env = []string{"NOEQUALS"} }, errdefs.ErrInvalidArgument},
		{"negative disk", func(s *runtime.Spec) { s.DiskBytes = -1 }, errdefs.ErrInvalidArgument},
		{"disk without pool", func(s *runtime.Spec) { s.DiskBytes = 64 << 20 }, errdefs.ErrFailedPrecondition},
		{"missing netns", func(s *runtime.Spec) { s.NetNSPath = "/nonexistent/netns" }, errdefs.ErrInvalidArgument},
		{"netns not a namespace", func(s *runtime.Spec) { s.NetNSPath = notNS.Name() }, errdefs.ErrInvalidArgument},
		// Passes validation; the init itself fails and everything is undone.
		{"netns of another type", func(s *runtime.Spec) { s.NetNSPath = "/proc/1/ns/uts" }, errdefs.ErrInvalidArgument},
		{"bad resources", func(s *runtime.Spec) { s.Resources = cgroups.Resources{CPUWeight: 1 << 40} }, errdefs.ErrInvalidArgument},
		{"duplicate id", func(s *runtime.Spec) { s.ID = "dup" }, errdefs.ErrAlreadyExists},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := e.spec("inv")
			tc.mod(&s)
			_, err := e.rt.Create(ctx, s)
			if !errors.Is(err, tc.class) {
				t.Fatalf("got %v, want %v", err, tc.class)
			}
			if s.ID != "dup" {
				if _, err := os.Stat(filepath.Join(e.base, "inv")); !os.IsNotExist(err) {
					t.Fatalf("failed create left its dir behind")
				}
			}
		})
	}
	// The existing sandbox is untouched by the failed duplicate.
	e.mustSh("dup", "true")
	// Nothing is left in the parent cgroup but dup's group.
	for _, p := range e.groupPaths(&runtime.State{Cgroup: e.parent + "/dup"}) {
		ents, _ := os.ReadDir(filepath.Dir(p))
		var groups []string
		for _, d := range ents {
			if d.IsDir() {
				groups = append(groups, d.Name())
			}
		}
		if len(groups) != 1 || groups[0] != "dup" {
			t.Fatalf("groups under %s: %v", filepath.Dir(p), groups)
		}
	}
}

// newSubvolumes mounts a fresh node btrfs image for one test and removes it
// (and the temp dir) afterwards.
func newSubvolumes(t *testing.T) *rootfs.Subvolumes {
	t.Helper()
	testutil.RequiresRoot(t)
	fss, _ := os.ReadFile("/proc/filesystems")
	testutil.RequiresFeature(t, "btrfs", strings.Contains(string(fss), "\tbtrfs\n"))
	base, err := os.MkdirTemp("/var/tmp", "dsec-rt-subvol-")
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(base, "private")
	sv, err := rootfs.OpenSubvolumes(context.Background(), root, rootfs.SubvolumeOptions{Image: filepath.Join(base, "private.img"), Size: 1 << 30})
	if err != nil {
		os.RemoveAll(base)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sv.Close(); err != nil {
			t.Error(err)
		}
		_ = unix.Unmount(root, unix.MNT_DETACH)
		os.RemoveAll(base)
	})
	return sv
}

// With subvolumes, a disk limit is a quota: the sandbox gets EDQUOT at its
// limit, neighbours are unaffected, usage is read from the quota, and a
// teardown leaves no subvolume.
func TestDiskLimitSubvolume(t *testing.T) {
	sv := newSubvolumes(t)
	e := newEnv(t, runtime.WithSubvolumes(sv))
	e.base = sv.Root()
	const size = 32 << 20
	st := e.create("disk1", func(s *runtime.Spec) { s.DiskBytes = size })
	e.create("disk2", func(s *runtime.Spec) { s.DiskBytes = size })
	e.create("nodisk")
	e.mustSh("disk1", "echo hello")
	r := e.sh("disk1", "dd if=/dev/zero of=/big bs=1M count=64 2>&1; sync")
	if !strings.Contains(r.stdout, "Disk quota exceeded") {
		t.Fatalf("writing 64 MiB under a 32 MiB limit: want EDQUOT, got %+v %q", r.ExecResult, r.stdout)
	}
	used, err := e.rt.DiskUsage("disk1")
	if err != nil || used < size/2 || used > size+(1<<20) {
		t.Fatalf("disk usage %d (%v) for a full %d limit", used, err, size)
	}
	e.mustSh("disk2", "dd if=/dev/zero of=/f bs=1M count=16 2>/dev/null && sync && test $(wc -c < /f) = 16777216")
	e.mustSh("nodisk", "dd if=/dev/zero of=/f bs=1M count=40 2>/dev/null && test $(wc -c < /f) = 41943040")
	e.mustSh("disk1", "rm /big && echo ok > /small && cat /small")
	upper, err := e.rt.UpperDir("disk1")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(upper, "small")); err != nil || string(b) != "ok\n" {
		t.Fatalf("upper: %q %v", b, err)
	}
	paths := e.groupPaths(st)
	if err := e.rt.Destroy(context.Background(), "disk1"); err != nil {
		t.Fatal(err)
	}
	e.assertGone(st, paths)
	if _, err := os.Stat(st.Dir); !os.IsNotExist(err) {
		t.Fatalf("subvolume of a destroyed sandbox: %v", err)
	}
}
