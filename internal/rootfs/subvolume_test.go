package rootfs_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/rootfs"
	"github.com/dsec-dev/dsec/internal/testutil"
)

func requireBtrfs(t *testing.T) {
	t.Helper()
	testutil.RequiresRoot(t)
	fss, _ := os.ReadFile("/proc/filesystems")
	testutil.RequiresFeature(t, "btrfs", strings.Contains(string(fss), "\tbtrfs\n"))
	_, err := os.Stat("/dev/loop-control")
	testutil.RequiresFeature(t, "loop devices (/dev/loop-control)", err == nil)
}

// openSubvolumes mounts a fresh node image below a temp dir and unmounts
// it at the end of the test whatever happened.
func openSubvolumes(t *testing.T) (*rootfs.Subvolumes, rootfs.SubvolumeOptions, string) {
	t.Helper()
	requireBtrfs(t)
	base, err := os.MkdirTemp("/var/tmp", "dsec-subvol-")
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(base, "scratch")
	o := rootfs.SubvolumeOptions{Image: filepath.Join(base, "scratch.img"), Size: 1 << 30}
	sv, err := rootfs.OpenSubvolumes(context.Background(), root, o)
	if err != nil {
		os.RemoveAll(base)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sv.Close()
		_ = unix.Unmount(root, unix.MNT_DETACH)
		os.RemoveAll(base)
	})
	return sv, o, root
}

func isMounted(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

func TestSubvolumeLimitAndUsage(t *testing.T) {
	sv, _, root := openSubvolumes(t)
	if !isMounted(t, root) {
		t.Fatal("node image not mounted")
	}
	const limit = 32 << 20
	dir := filepath.Join(root, "sb1")
	if err := sv.Create(dir, limit); err != nil {
		t.Fatal(err)
	}
	if err := sv.Create(dir, limit); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second create: %v", err)
	}
	free := filepath.Join(root, "sb2")
	if err := sv.Create(free, 0); err != nil {
		t.Fatal(err)
	}
	// Writing past the limit fails with EDQUOT (also for root); the
	// unlimited neighbour writes more than that.
	err := writeZeros(filepath.Join(dir, "big"), 64<<20)
	if !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("writing 64 MiB under a 32 MiB limit: %v", err)
	}
	if err := writeZeros(filepath.Join(free, "big"), 48<<20); err != nil {
		t.Fatalf("unlimited subvolume: %v", err)
	}
	used, err := sv.Usage(dir)
	if err != nil {
		t.Fatal(err)
	}
	if used < limit/2 || used > limit+(1<<20) {
		t.Fatalf("usage %d for a full %d limit", used, limit)
	}
	// Freeing space makes room again.
	if err := os.Remove(filepath.Join(dir, "big")); err != nil {
		t.Fatal(err)
	}
	if err := writeZeros(filepath.Join(dir, "small"), 1<<20); err != nil {
		t.Fatalf("after freeing: %v", err)
	}
	if err := sv.Delete(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("deleted subvolume still there: %v", err)
	}
	if err := sv.Delete(dir); err != nil {
		t.Fatalf("deleting a missing subvolume: %v", err)
	}
	if err := sv.Delete(free); err != nil {
		t.Fatal(err)
	}
	// Empty again: Close unmounts the node image.
	if err := sv.Close(); err != nil {
		t.Fatal(err)
	}
	if isMounted(t, root) {
		t.Fatal("Close left the empty node file system mounted")
	}
}

func TestSubvolumeInvalid(t *testing.T) {
	sv, _, root := openSubvolumes(t)
	tests := []struct {
		name  string
		dir   string
		limit int64
	}{
		{"outside the root", filepath.Join(t.TempDir(), "x"), 0},
		{"the root itself", root, 0},
		{"dot dot", root + "/..", 0},
		{"negative limit", filepath.Join(root, "neg"), -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := sv.Create(tc.dir, tc.limit); !errdefs.IsInvalidArgument(err) {
				t.Fatalf("got %v, want invalid argument", err)
			}
		})
	}
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Fatalf("failed creates left %v", ents)
	}
}

// A node file system with sandboxes in it outlives the process that
// mounted it (a restarted server adopts them) and is reused, not remade.
func TestSubvolumesSurviveReopen(t *testing.T) {
	sv, o, root := openSubvolumes(t)
	dir := filepath.Join(root, "kept")
	if err := sv.Create(dir, 64<<20); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("state"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := sv.Close(); err != nil {
		t.Fatal(err)
	}
	if !isMounted(t, root) {
		t.Fatal("Close unmounted a file system that still holds a sandbox")
	}
	sv2, err := rootfs.OpenSubvolumes(context.Background(), root, o)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "f")); err != nil || string(b) != "state" {
		t.Fatalf("after reopen: %q %v", b, err)
	}
	// The limit survived too.
	if err := writeZeros(filepath.Join(dir, "big"), 96<<20); !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("limit after reopen: %v", err)
	}
	if err := sv2.Delete(dir); err != nil {
		t.Fatal(err)
	}
	if err := sv2.Close(); err != nil {
		t.Fatal(err)
	}
	if isMounted(t, root) {
		t.Fatal("reopened node file system not unmounted once empty")
	}
}

// A non-empty directory that is not btrfs is never mounted over.
func TestSubvolumesRefuseNonEmptyRoot(t *testing.T) {
	requireBtrfs(t)
	base := t.TempDir()
	root := filepath.Join(base, "scratch")
	os.MkdirAll(filepath.Join(root, "old-sandbox"), 0o700)
	_, err := rootfs.OpenSubvolumes(context.Background(), root, rootfs.SubvolumeOptions{Image: filepath.Join(base, "img"), Size: 1 << 30})
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("got %v, want failed precondition", err)
	}
	if isMounted(t, root) {
		t.Fatal("mounted over a non-empty dir")
	}
}

func TestPrepareInSubvolume(t *testing.T) {
	sv, _, root := openSubvolumes(t)
	lower := t.TempDir()
	for _, disk := range []int64{0, 64 << 20} {
		dir := filepath.Join(root, "sb")
		l, err := rootfs.Prepare(context.Background(), dir, []string{lower}, disk, rootfs.Disks{Subvolumes: sv})
		if err != nil {
			t.Fatal(err)
		}
		if l.Disk != nil {
			t.Fatalf("layout %+v", l)
		}
		// upper and work share one private subvolume; the sandbox dir
		// around it (exec records) is not charged to the sandbox.
		var st, dst unix.Stat_t
		private := filepath.Join(dir, rootfs.PrivateName)
		if err := unix.Stat(private, &st); err != nil || st.Ino != 256 || st.Mode&0o777 != 0o700 {
			t.Fatalf("%s is not a private subvolume: ino %d mode %o %v", private, st.Ino, st.Mode, err)
		}
		if err := unix.Stat(dir, &dst); err != nil || dst.Ino == 256 {
			t.Fatalf("sandbox dir is a subvolume itself: %v", err)
		}
		if filepath.Dir(l.Overlay.Upper) != private || filepath.Dir(l.Overlay.Work) != private {
			t.Fatalf("layout %+v", l.Overlay)
		}
		os.WriteFile(filepath.Join(l.Overlay.Upper, "f"), []byte("x"), 0o644)
		os.MkdirAll(filepath.Join(dir, "execs", "e1"), 0o700)
		if err := rootfs.Remove(dir); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Fatalf("Remove left %s: %v", dir, err)
		}
	}
	// A failed prepare leaves no subvolume.
	if _, err := rootfs.Prepare(context.Background(), filepath.Join(root, "bad"), []string{"/nonexistent"}, 0, rootfs.Disks{Subvolumes: sv}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("got %v", err)
	}
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Fatalf("left %v", ents)
	}
}

func writeZeros(path string, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for n > 0 {
		k := min(n, len(buf))
		if _, err := f.Write(buf[:k]); err != nil {
			f.Close()
			return err
		}
		n -= k
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
