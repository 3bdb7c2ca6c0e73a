//go:build linux

package sandboxfs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testutil"
)

// TestEscapes tries every way out we know of, for every operation, and
// checks that the host side ("outside") is never read or changed: paths
// that leave the root either resolve to the sandbox's own files or do not
// exist.
func TestEscapes(t *testing.T) {
	s := newSandbox(t)
	// A decoy at the path the relative escapes clamp to.
	s.hostWrite(t, s.in("outside/secret"), "SANDBOX")
	s.symlink(t, s.outside, "hostabs")                            // absolute host path to a dir
	s.symlink(t, filepath.Join(s.outside, "secret"), "leak")      // absolute host path to a file
	s.symlink(t, "../outside", "dotdot")                          // relative, leaves the root by one
	s.symlink(t, "../../../../../../../../outside/secret", "a/b") // long relative chain at the end
	s.symlink(t, "/", "slash")                                    // absolute to "/"
	s.symlink(t, "../../..", "d/up")                              // relative in the middle
	before := snapshot(t, s.outside)

	reads := []struct {
		path string
		want string // "" = must not be found
	}{
		{"../outside/secret", "SANDBOX"},
		{"../../../../outside/secret", "SANDBOX"},
		{"/x/../../outside/secret", "SANDBOX"},
		{"dotdot/secret", "SANDBOX"},
		{"a/b", "SANDBOX"},
		{"slash/outside/secret", "SANDBOX"},
		{"d/up/outside/secret", "SANDBOX"},
		{"d/up/../../outside/secret", "SANDBOX"},
		{"hostabs/secret", ""},
		{"leak", ""},
		{s.outside + "/secret", ""},
		{"slash" + s.outside + "/secret", ""},
	}
	for _, tc := range reads {
		t.Run("read "+tc.path, func(t *testing.T) {
			got, err := readAll(t, s.root, tc.path)
			if tc.want == "" {
				requireClass(t, err, errdefs.ErrNotFound)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("read %q = %q, want %q", tc.path, got, tc.want)
			}
			fi, err := s.root.Stat(tc.path)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(fi.Path, "/") || strings.Contains(fi.Path, "..") {
				t.Fatalf("Stat path %q is not clean and absolute", fi.Path)
			}
		})
	}

	writes := []struct {
		path string
		err  error // nil: succeeds, inside the root
	}{
		// hostabs dangles inside the root: like mkdir -p, creating
		// directories through a dangling symlink fails.
		{"hostabs/secret", errdefs.ErrAlreadyExists},
		{"hostabs/new", errdefs.ErrAlreadyExists},
		{"hostabs/sub/new", errdefs.ErrAlreadyExists},
		{"leak", nil},
		{"../outside/new", nil},
		{"dotdot/new", nil},
		{"slash" + s.outside + "/new", nil},
		{"d/up/../../outside/secret", nil},
	}
	for _, tc := range writes {
		t.Run("write "+tc.path, func(t *testing.T) {
			_, err := s.root.WriteFile(tc.path, 0o644, strings.NewReader("PWNED"))
			if tc.err != nil {
				requireClass(t, err, tc.err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := s.root.MkdirAll(tc.path+".d/x", 0o755); err != nil {
				t.Fatal(err)
			}
		})
	}
	// The final-component symlink was replaced, not followed.
	if fi, err := os.Lstat(s.in("leak")); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("leak: %v %v, want a regular file replacing the link", fi, err)
	}
	for _, p := range []string{"hostabs", "dotdot/secret", "slash" + s.outside, "../outside/secret"} {
		t.Run("remove "+p, func(t *testing.T) {
			if err := s.root.Remove(p, true); err != nil && !errdefs.IsNotFound(err) {
				t.Fatal(err)
			}
		})
	}
	for _, tc := range [][2]string{{"hostabs/new", "x"}, {"x2", "hostabs/y"}, {"leak", "dotdot/z"}} {
		_ = s.root.Rename(tc[0], tc[1]) // may fail (missing source); must not escape
	}
	if after := snapshot(t, s.outside); after != before {
		t.Fatalf("host directory changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestMagicLinks checks /proc-style paths. A fake proc made of plain
// symlinks resolves inside the root; a real procfs's magic links
// (/proc/self/root, /proc/1/root, /proc/self/fd/N) are refused.
func TestMagicLinks(t *testing.T) {
	t.Run("fake", func(t *testing.T) {
		s := newSandbox(t)
		s.hostWrite(t, s.in("etc/passwd"), "sandbox passwd")
		s.symlink(t, "/", "proc/self/root")
		s.symlink(t, "/", "proc/1/root")
		for _, p := range []string{"/proc/self/root/etc/passwd", "/proc/1/root/etc/passwd"} {
			got, err := readAll(t, s.root, p)
			if err != nil || got != "sandbox passwd" {
				t.Fatalf("read %s = %q, %v", p, got, err)
			}
		}
	})
	t.Run("procfs", func(t *testing.T) {
		testutil.RequiresRoot(t)
		s := newSandbox(t)
		mountProc(t, s.in("proc"))
		before := snapshot(t, s.outside)
		self := strconv.Itoa(os.Getpid())
		f, err := os.Open(filepath.Join(s.outside, "secret"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fdPath := "/proc/self/fd/" + strconv.Itoa(int(f.Fd()))
		for _, p := range []string{
			"/proc/self/root" + s.outside + "/secret",
			"/proc/1/root" + s.outside + "/secret",
			"/proc/" + self + "/root" + s.outside + "/secret",
			"/proc/self/cwd",
			"/proc/self/exe",
			fdPath,
		} {
			// ELOOP from RESOLVE_NO_MAGICLINKS; for pid 1, procfs's own
			// ptrace check may answer EACCES first: refused either way.
			check := requireRefused
			if !strings.HasPrefix(p, "/proc/1/") {
				check = func(t *testing.T, err error) { t.Helper(); requireClass(t, err, errdefs.ErrInvalidArgument) }
			}
			_, err := readAll(t, s.root, p)
			check(t, err)
			_, err = s.root.Stat(p)
			check(t, err)
			_, err = s.root.WriteFile(p+"/x", 0o644, strings.NewReader("PWNED"))
			if err == nil {
				t.Fatalf("write under %s succeeded", p)
			}
		}
		// Lstat of the link itself is harmless metadata and allowed.
		if fi, err := s.root.Lstat("/proc/self/root"); err != nil || fi.Symlink == "" {
			t.Fatalf("lstat /proc/self/root: %+v, %v", fi, err)
		}
		// procfs content is not served with the host's privileges.
		_, err = readAll(t, s.root, "/proc/self/status")
		requireClass(t, err, errdefs.ErrPermissionDenied)
		requireClass(t, s.root.MkdirAll("/proc/dsec-test", 0o755), errdefs.ErrPermissionDenied)
		if after := snapshot(t, s.outside); after != before {
			t.Fatalf("host directory changed:\n%s\n%s", before, after)
		}
	})
}

// TestProcRootOfNamespace uses a real /proc/<pid>/root of a process in
// its own mount namespace: the path walk must follow that namespace's
// mounts, not the host's.
func TestProcRootOfNamespace(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount -t tmpfs -o size=4m tmpfs "$0" && echo inside > "$0/marker" && echo ready && exec sleep 600`, dir)
	var out bytes.Buffer
	cmd.Stdout = &syncWriter{w: &out}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(cmd.Stdout.(*syncWriter).String(), "ready") {
		if time.Now().After(deadline) {
			t.Fatal("namespace helper did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	r, err := OpenRoot("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/root")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got, err := readAll(t, r, dir+"/marker"); err != nil || got != "inside\n" {
		t.Fatalf("marker inside the namespace: %q, %v", got, err)
	}
	if _, err := r.WriteFile(dir+"/written", 0o600, strings.NewReader("via api")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "written")); !os.IsNotExist(err) {
		t.Fatalf("file written through the namespace root appeared on the host: %v", err)
	}
	if got, err := readAll(t, r, dir+"/written"); err != nil || got != "via api" {
		t.Fatalf("read back: %q, %v", got, err)
	}
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}

// TestSymlinkSwapRace flips a directory with a symlink (to "/", to the
// host directory by absolute path, and by a relative chain) while writes,
// mkdirs and recursive removes run through it. Whatever interleaving
// happens, nothing outside the root may be created, changed or removed.
func TestSymlinkSwapRace(t *testing.T) {
	s := newSandbox(t)
	hostProbe := "/dsec-race-" + strconv.Itoa(os.Getpid()) // would appear at the host's / on escape
	t.Cleanup(func() { os.RemoveAll(hostProbe) })
	s.hostWrite(t, filepath.Join(s.outside, "sub", "keep"), "HOST")
	before := snapshot(t, s.outside)

	var stop atomic.Bool
	var wg sync.WaitGroup
	targets := []string{"/", s.outside, "../../../../../../.." + s.outside}
	wg.Go(func() {
		d, real := s.in("d"), s.in("d.real")
		for i := 0; !stop.Load(); i++ {
			os.MkdirAll(filepath.Join(real, "sub"), 0o755)
			os.Rename(real, d) // d is a directory
			os.Rename(d, real)
			os.Symlink(targets[i%len(targets)], d) // d is a symlink
			os.Remove(d)
		}
	})
	ops, written := 0, 0
	for start := time.Now(); time.Since(start) < 2*time.Second; ops++ {
		name := "d" + hostProbe + "/f" // d -> "/" would make this the host probe
		if _, err := s.root.WriteFile(name, 0o644, strings.NewReader("PWNED")); err == nil {
			written++
		}
		if _, err := s.root.WriteFile("d/sub/keep", 0o644, strings.NewReader("PWNED")); err == nil {
			written++
		}
		s.root.MkdirAll("d/sub/newdir", 0o755)
		s.root.Remove("d/sub", true)
		s.root.Rename("d/sub/keep", "d/sub/moved")
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d rounds of operations, %d writes succeeded", ops, written)
	if written == 0 {
		t.Fatal("no write got through: the race was never exercised")
	}
	if _, err := os.Lstat(hostProbe); !os.IsNotExist(err) {
		t.Fatalf("%s was created on the host: %v", hostProbe, err)
	}
	if after := snapshot(t, s.outside); after != before {
		t.Fatalf("host directory changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestHardlink: a hard link to a host file inside the root (same file
// system) can be read, but writing through it replaces the name instead
// of changing the shared inode.
func TestHardlink(t *testing.T) {
	s := newSandbox(t)
	if err := os.Link(filepath.Join(s.outside, "secret"), s.in("hl")); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, s.outside)
	if got, err := readAll(t, s.root, "/hl"); err != nil || got != "HOST" {
		t.Fatalf("read hard link: %q, %v", got, err)
	}
	if _, err := s.root.WriteFile("/hl", 0o600, strings.NewReader("new")); err != nil {
		t.Fatal(err)
	}
	if got, _ := readAll(t, s.root, "/hl"); got != "new" {
		t.Fatalf("after write: %q", got)
	}
	if err := s.root.Remove("/hl", false); err != nil {
		t.Fatal(err)
	}
	if after := snapshot(t, s.outside); after != before {
		t.Fatalf("host file changed through a hard link:\n%s\n%s", before, after)
	}
}

// TestDanglingSymlink writes to a path whose last component is a symlink
// to a file that does not exist: the link is replaced, its target (inside
// or outside) is never created.
func TestDanglingSymlink(t *testing.T) {
	s := newSandbox(t)
	s.symlink(t, "/etc/created-by-link", "inner")
	s.symlink(t, filepath.Join(s.outside, "created-by-link"), "outer")
	for _, p := range []string{"/inner", "/outer"} {
		fi, err := s.root.WriteFile(p, 0o640, strings.NewReader("data"))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Symlink != "" || !fi.Mode.IsRegular() || fi.Size != 4 {
			t.Fatalf("write %s: %+v", p, fi)
		}
		l, err := os.Lstat(s.in(p))
		if err != nil || !l.Mode().IsRegular() {
			t.Fatalf("%s is not a regular file now: %v %v", p, l, err)
		}
	}
	for _, p := range []string{s.in("etc/created-by-link"), filepath.Join(s.outside, "created-by-link")} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Fatalf("symlink target %s was created: %v", p, err)
		}
	}
}

func requireRefused(t *testing.T, err error) {
	t.Helper()
	if !errdefs.IsInvalidArgument(err) && !errdefs.IsPermissionDenied(err) {
		t.Fatalf("error %v, want invalid argument or permission denied", err)
	}
}
