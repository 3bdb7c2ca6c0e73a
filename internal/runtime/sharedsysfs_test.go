package runtime

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/testutil"
)

func TestSharedSysfsLifecycle(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	s := &sharedSysfs{dir: dir}
	t.Cleanup(func() { _ = s.unmount() })
	lsNet := func(p string) []string {
		ents, _ := os.ReadDir(filepath.Join(p, "class/net"))
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return names
	}

	p, err := s.path()
	if err != nil {
		t.Fatal(err)
	}
	if got := lsNet(p); len(got) != 1 || got[0] != "lo" {
		t.Fatalf("template shows %v, want [lo]", got)
	}
	if b, _ := os.ReadFile(filepath.Join(p, "class/net/lo/operstate")); len(b) == 0 {
		t.Errorf("lo operstate unreadable")
	}
	if unix.Access(filepath.Join(p, "kernel"), unix.W_OK) == nil {
		t.Errorf("template is writable")
	}

	// A server that stopped with sandboxes left keeps it; the next one
	// takes it over as it is.
	if err := s.close(1); err != nil {
		t.Fatal(err)
	}
	next := &sharedSysfs{dir: dir}
	var before, after unix.Stat_t
	_ = unix.Stat(p, &before)
	if _, err := next.path(); err != nil {
		t.Fatal(err)
	}
	_ = unix.Stat(p, &after)
	if before.Dev != after.Dev {
		t.Errorf("the kept template was replaced (dev %d -> %d)", before.Dev, after.Dev)
	}

	// A template whose namespace is gone (its netns mount removed: the
	// state a reboot-less crash cleanup could leave) shows no devices and
	// is replaced by a new one.
	if err := unix.Unmount(next.netnsFile(), unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(lsNet(p)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := lsNet(p); len(got) > 0 {
		t.Fatalf("namespace still alive without its mount: %v", got)
	}
	third := &sharedSysfs{dir: dir}
	if _, err := third.path(); err != nil {
		t.Fatal(err)
	}
	if got := lsNet(p); len(got) != 1 || got[0] != "lo" {
		t.Fatalf("replaced template shows %v, want [lo]", got)
	}

	// With no sandbox left, close unmounts both.
	if err := third.close(0); err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil || st.Type == unix.SYSFS_MAGIC {
		t.Errorf("sysfs still mounted after close (err %v)", err)
	}
	if err := unix.Statfs(third.netnsFile(), &st); err != nil || st.Type == unix.NSFS_MAGIC {
		t.Errorf("netns still mounted after close (err %v)", err)
	}
}
