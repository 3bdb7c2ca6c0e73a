//go:build linux

package sandboxfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// sandbox is a root directory with an "outside" sibling standing for the
// host: tests put bait there and check it is never read or changed.
type sandbox struct {
	dir     string // the root's host path
	outside string // host-only directory next to it
	root    *Root
}

func newSandbox(t *testing.T, opts ...Option) *sandbox {
	t.Helper()
	base := t.TempDir()
	s := &sandbox{dir: filepath.Join(base, "root"), outside: filepath.Join(base, "outside")}
	for _, d := range []string{s.dir, s.outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s.hostWrite(t, filepath.Join(s.outside, "secret"), "HOST")
	r, err := OpenRoot(s.dir, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	s.root = r
	return s
}

// in returns the host path of a path inside the sandbox.
func (s *sandbox) in(p string) string { return filepath.Join(s.dir, p) }

func (s *sandbox) hostWrite(t *testing.T, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (s *sandbox) symlink(t *testing.T, target, inside string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(s.in(inside)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, s.in(inside)); err != nil {
		t.Fatal(err)
	}
}

// snapshot describes every entry under dir (type, mode, content or
// target), to show a host directory was left exactly as it was.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %v", p, fi.Mode())
		switch {
		case fi.Mode().IsRegular():
			c, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " %q", c)
		case fi.Mode()&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " -> %s", l)
		}
		b.WriteByte('\n')
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func readAll(t *testing.T, r *Root, p string) (string, error) {
	t.Helper()
	rc, _, err := r.Open(p)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), nil
}

func requireClass(t *testing.T, err error, class error) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %v", class)
	}
	if !errors.Is(err, class) {
		t.Fatalf("error %q is not %v", err, class)
	}
}

func mountTmpfs(t *testing.T, dir, opts string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, opts); err != nil {
		t.Fatalf("mount tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}

func mountProc(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("proc", dir, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		t.Fatalf("mount proc on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}
