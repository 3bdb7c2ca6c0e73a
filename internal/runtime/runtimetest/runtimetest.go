// Package runtimetest builds what tests of the runtime and of packages on
// top of it need: a tiny busybox root file system and a NamespaceRuntime
// wired to the host's real cgroups under a throw-away parent group.
//
// The rootfs needs a static busybox (Debian: apt-get install busybox-static).
package runtimetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/runtime"
)

// BusyboxPaths are where a static busybox is looked for.
var BusyboxPaths = []string{"/bin/busybox", "/usr/bin/busybox"}

// Passwd and Group are the rootfs's /etc files: root, alice (1000) in
// groups alice and staff (50), nobody.
const (
	Passwd = "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000:Alice:/home/alice:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
	Group  = "root:x:0:\nstaff:x:50:alice\nalice:x:1000:\nnogroup:x:65534:\n"
)

// FindBusybox returns a statically linked busybox or "".
func FindBusybox() string {
	for _, p := range BusyboxPaths {
		out, err := exec.Command("file", "-L", p).Output()
		if err == nil && strings.Contains(string(out), "statically linked") {
			return p
		}
		if err != nil {
			// No file(1): trust a busybox that exists.
			if _, serr := os.Stat(p); serr == nil {
				return p
			}
		}
	}
	return ""
}

// BuildRootfs writes a busybox root file system into dir (created).
func BuildRootfs(dir string) error {
	bb := FindBusybox()
	if bb == "" {
		return fmt.Errorf("no static busybox found in %v (apt-get install busybox-static)", BusyboxPaths)
	}
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "etc", "root", "home/alice", "proc", "dev", "sys", "tmp", "var"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chown(filepath.Join(dir, "home/alice"), 1000, 1000); err != nil {
		return err
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), data, 0o755); err != nil {
		return err
	}
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", applet)); err != nil && !os.IsExist(err) {
			return err
		}
	}
	files := map[string]string{"etc/passwd": Passwd, "etc/group": Group, "etc/hostname": "rootfs\n"}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return os.Chmod(filepath.Join(dir, "tmp"), 0o1777)
}

// RandomName is a short random suffix for cgroup and dir names.
func RandomName(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// Cgroups returns the host's cgroup manager.
func Cgroups(t testing.TB) cgroups.Manager {
	t.Helper()
	m, err := cgroups.Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatalf("cgroups: %v", err)
	}
	return m
}

// NewRuntime returns a runtime whose sandboxes live in a fresh parent
// cgroup that is removed (with anything left in it) when the test ends.
func NewRuntime(t testing.TB, opts ...runtime.Option) (*runtime.NamespaceRuntime, cgroups.Manager, string) {
	t.Helper()
	m := Cgroups(t)
	parent := RandomName("dsectest-")
	sysfs, err := os.MkdirTemp("", "dsec-sysfs-")
	if err != nil {
		t.Fatal(err)
	}
	rt, err := runtime.NewNamespaceRuntime(m, append([]runtime.Option{runtime.WithCgroupParent(parent),
		runtime.WithSharedSysfs(sysfs)}, opts...)...)
	if err != nil {
		t.Fatalf("runtime: %v", err)
	}
	t.Cleanup(func() {
		if err := rt.Close(); err != nil {
			t.Errorf("close runtime: %v", err)
		}
		// Close keeps the shared sysfs while sandboxes are left; a test
		// that leaves some has them killed below.
		for _, p := range []string{"sys", "netns"} {
			_ = unix.Unmount(filepath.Join(sysfs, p), unix.MNT_DETACH)
		}
		if err := os.RemoveAll(sysfs); err != nil {
			t.Errorf("shared sysfs dir: %v", err)
		}
		RemoveCgroupTree(m, parent)
	})
	return rt, m, parent
}

// RemoveCgroupTree deletes parent and every group below it in all
// hierarchies (after killing what runs there). Test cleanup only.
func RemoveCgroupTree(m cgroups.Manager, parent string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/" + parent)
	if v, _ := filepath.Glob("/sys/fs/cgroup/" + parent); len(v) > 0 {
		roots = append(roots, v...)
	}
	for _, root := range roots {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			rel := strings.TrimPrefix(dirs[i], filepath.Dir(root)+"/")
			if g, err := m.Load(ctx, rel); err == nil {
				_ = g.Thaw(ctx)
				_ = g.Kill(ctx)
				_ = g.Delete(ctx)
			}
			_ = os.Remove(dirs[i])
		}
	}
}
