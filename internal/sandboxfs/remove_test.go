//go:build linux

package sandboxfs

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testutil"
)

func TestRemove(t *testing.T) {
	s := newSandbox(t)
	s.hostWrite(t, s.in("tree/a/b/c"), "c")
	s.hostWrite(t, s.in("tree/x"), "x")
	s.symlink(t, s.outside, "tree/hostlink")       // absolute link out
	s.symlink(t, "../../../outside", "tree/a/rel") // relative link out
	s.hostWrite(t, s.in("file"), "f")
	s.symlink(t, "/file", "filelink")
	if err := os.Mkdir(s.in("empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, s.outside)

	if err := s.root.Remove("/filelink", false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.in("file")); err != nil {
		t.Fatal("removing a symlink removed its target")
	}
	if err := s.root.Remove("/empty", false); err != nil {
		t.Fatal(err)
	}
	if err := s.root.Remove("/file", true); err != nil { // recursive on a file is fine
		t.Fatal(err)
	}
	if err := s.root.Remove("/tree", true); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"tree", "file", "empty", "filelink"} {
		if _, err := os.Lstat(s.in(p)); !os.IsNotExist(err) {
			t.Fatalf("%s still there: %v", p, err)
		}
	}
	if after := snapshot(t, s.outside); after != before {
		t.Fatalf("host directory changed:\n%s\n%s", before, after)
	}
}

// TestRemoveBatches removes a directory larger than one read batch.
func TestRemoveBatches(t *testing.T) {
	old := removeBatch
	removeBatch = 7
	t.Cleanup(func() { removeBatch = old })
	s := newSandbox(t)
	for i := range 100 {
		s.hostWrite(t, s.in(filepath.Join("big", "sub", strconv.Itoa(i))), "x")
	}
	if err := s.root.Remove("/big", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(s.in("big")); !os.IsNotExist(err) {
		t.Fatalf("big still there: %v", err)
	}
}

// TestRemoveMountPoint: recursive removal does not descend into another
// mount (rm --one-file-system), so a bind mount's contents are safe.
func TestRemoveMountPoint(t *testing.T) {
	testutil.RequiresRoot(t)
	s := newSandbox(t)
	mountTmpfs(t, s.in("tree/mnt"), "size=1m")
	s.hostWrite(t, s.in("tree/mnt/precious"), "keep")
	s.hostWrite(t, s.in("tree/other"), "x")
	err := s.root.Remove("/tree", true)
	requireClass(t, err, errdefs.ErrFailedPrecondition)
	if !strings.Contains(err.Error(), "/tree/mnt") {
		t.Fatalf("error %q does not name the mount point", err)
	}
	if got, err := os.ReadFile(s.in("tree/mnt/precious")); err != nil || string(got) != "keep" {
		t.Fatalf("mounted file: %q %v", got, err)
	}
	// Inside the mount, removal works.
	if err := s.root.Remove("/tree/mnt/precious", false); err != nil {
		t.Fatal(err)
	}
}

// TestRemoveSwapRace swaps a directory inside the tree being removed for
// a symlink to the host directory, repeatedly: the host side survives.
func TestRemoveSwapRace(t *testing.T) {
	s := newSandbox(t)
	for i := range 20 {
		s.hostWrite(t, filepath.Join(s.outside, "victim", "f"+string(rune('a'+i))), "HOST")
	}
	before := snapshot(t, s.outside)
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		swap := s.in("tree/swap")
		for !stop.Load() {
			os.MkdirAll(filepath.Join(swap, "x", "y"), 0o755)
			os.WriteFile(filepath.Join(swap, "x", "f"), []byte("x"), 0o644)
			os.RemoveAll(swap + ".old")
			os.Rename(swap, swap+".old")
			os.Symlink(filepath.Join(s.outside, "victim"), swap)
			time.Sleep(time.Microsecond)
			os.Remove(swap)
		}
	})
	removed := 0
	for start := time.Now(); time.Since(start) < time.Second; {
		os.MkdirAll(s.in("tree/d/e"), 0o755)
		if err := s.root.Remove("/tree", true); err == nil {
			removed++
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d successful recursive removals", removed)
	if after := snapshot(t, s.outside); after != before {
		t.Fatalf("host directory changed:\n%s\n%s", before, after)
	}
}

func TestRename(t *testing.T) {
	s := newSandbox(t)
	s.hostWrite(t, s.in("a/file"), "content")
	s.symlink(t, "/a", "alink")
	s.symlink(t, s.outside+"/secret", "b") // "to" is a symlink: replaced, not followed
	before := snapshot(t, s.outside)
	if err := s.root.Rename("/alink/file", "/b"); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(s.in("b")); err != nil || string(got) != "content" {
		t.Fatalf("renamed file: %q %v", got, err)
	}
	if err := s.root.Rename("/a", "/missing/x"); err == nil {
		t.Fatal("rename into a missing directory succeeded")
	}
	if err := s.root.Rename("/a", "/c"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(s.in("c")); err != nil || !fi.IsDir() {
		t.Fatalf("renamed dir: %v %v", fi, err)
	}
	if after := snapshot(t, s.outside); after != before {
		t.Fatalf("host directory changed:\n%s\n%s", before, after)
	}
}

// TestRenameAcrossMounts reports EXDEV as a clear invalid-argument error.
func TestRenameAcrossMounts(t *testing.T) {
	testutil.RequiresRoot(t)
	s := newSandbox(t)
	mountTmpfs(t, s.in("tmp"), "size=1m")
	s.hostWrite(t, s.in("file"), "x")
	err := s.root.Rename("/file", "/tmp/file")
	requireClass(t, err, errdefs.ErrInvalidArgument)
	if !strings.Contains(err.Error(), "mount") {
		t.Fatalf("error %q does not explain", err)
	}
}

// TestDeviceNotOpened: a device node in the sandbox is never opened with
// the host's privileges.
func TestDeviceNotOpened(t *testing.T) {
	testutil.RequiresRoot(t)
	s := newSandbox(t)
	if err := unix.Mknod(s.in("zero"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 5))); err != nil {
		t.Fatal(err)
	}
	_, _, err := s.root.Open("/zero")
	requireClass(t, err, errdefs.ErrInvalidArgument)
	// Metadata is fine.
	fi, err := s.root.Stat("/zero")
	if err != nil || fi.Mode&os.ModeCharDevice == 0 {
		t.Fatalf("stat device: %+v %v", fi, err)
	}
	// Writing replaces the node rather than writing into the device.
	if _, err := s.root.WriteFile("/zero", 0o644, strings.NewReader("file now")); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Lstat(s.in("zero")); !fi.Mode().IsRegular() {
		t.Fatalf("device node not replaced: %v", fi.Mode())
	}
}
