// Package e2b tests dsec's E2B-compatible API with the real, unmodified e2b
// npm SDK: a real server (dsec serve --e2b-listen), a real image, real
// sandboxes, and Node.js running the SDK.
package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/testutil"
)

// sdkVersion is the pinned e2b npm package the tests run.
const sdkVersion = "2.51.0"

var (
	dsecBin  string // built once in TestMain
	repoRoot string
)

func TestMain(m *testing.M) {
	_, file, _, _ := runtime.Caller(0)
	repoRoot = filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	tmp, err := os.MkdirTemp("", "dsec-e2b-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dsecBin = filepath.Join(tmp, "dsec")
	build := exec.Command("go", "build", "-o", dsecBin, "./cmd/dsec")
	build.Dir = repoRoot
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2b: building dsec:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(tmp)
	os.Exit(code)
}

// server is one `dsec serve` with a native unix socket and an E2B TCP
// listener, in its own directory.
type server struct {
	t       testing.TB
	dir     string
	dataDir string
	sock    string // native API, unix://
	e2bURL  string // http://127.0.0.1:PORT
	cmd     *exec.Cmd
	done    chan struct{}
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startServer starts dsec serve and registers the cleanup: sandboxes
// deleted, server and layer daemon stopped, nothing mounted below dir.
func startServer(t testing.TB, extra ...string) *server {
	t.Helper()
	testutil.RequiresRoot(t)
	dir, err := os.MkdirTemp("", "dsec-e2b-")
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	s := &server{
		t: t, dir: dir, dataDir: filepath.Join(dir, "data"),
		sock:   "unix://" + filepath.Join(dir, "dsec.sock"),
		e2bURL: fmt.Sprintf("http://127.0.0.1:%d", port),
		done:   make(chan struct{}),
	}
	args := append([]string{"serve", "--data-dir", s.dataDir, "--listen", s.sock,
		"--e2b-listen", fmt.Sprintf("tcp://127.0.0.1:%d", port)}, extra...)
	s.cmd = exec.Command(dsecBin, args...)
	s.cmd.WaitDelay = 5 * time.Second
	logBuf := &testutil.SyncBuffer{}
	s.cmd.Stdout, s.cmd.Stderr = logBuf, logBuf
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() { s.cleanup(logBuf) })
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
			if _, _, code := s.cli("node", "ls"); code == 0 {
				return s
			}
		}
		select {
		case <-s.done:
			t.Fatalf("server exited:\n%s", logBuf.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not come up:\n%s", logBuf.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *server) cleanup(logBuf *testutil.SyncBuffer) {
	select {
	case <-s.done:
	default:
		if out, _, code := s.cli("sandbox", "ls", "--json"); code == 0 {
			var sbs []struct{ ID string }
			if json.Unmarshal([]byte(out), &sbs) == nil {
				for _, sb := range sbs {
					s.cli("sandbox", "rm", sb.ID)
				}
			}
		}
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	}
	// The layer daemon outlives a server by design; stop it here.
	_ = exec.Command(dsecBin, "layerd-stop", "--data-dir", s.dataDir).Run()
	if s.t.Failed() {
		s.t.Logf("server log:\n%s", logBuf.String())
	}
	for _, m := range mountsBelow(s.dir) {
		s.t.Errorf("left mounted: %s", m)
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
	_ = os.RemoveAll(s.dir)
}

// cli runs the dsec CLI against the server's unix socket (as admin).
func (s *server) cli(args ...string) (stdout, stderr string, code int) {
	cmd := exec.Command(dsecBin, args...)
	cmd.Env = append(os.Environ(), "DSEC_ADDR="+s.sock)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return o.String(), e.String(), ee.ExitCode()
	} else if err != nil {
		return o.String(), err.Error(), -1
	}
	return o.String(), e.String(), 0
}

func (s *server) mustCLI(args ...string) string {
	s.t.Helper()
	out, errOut, code := s.cli(args...)
	if code != 0 {
		s.t.Fatalf("dsec %s: exit %d: %s", strings.Join(args, " "), code, errOut)
	}
	return out
}

// importImage builds the small real rootfs (busybox + bash) and imports it
// as a public image, so any tenant may use it.
func (s *server) importImage(ref string) {
	s.t.Helper()
	rootfs := filepath.Join(s.dir, "rootfs")
	if out, err := exec.Command(filepath.Join(repoRoot, "scripts", "mkrootfs.sh"), rootfs).CombinedOutput(); err != nil {
		s.t.Fatalf("mkrootfs: %v\n%s", err, out)
	}
	s.mustCLI("image", "import", "--public", ref, rootfs)
}

// e2bKey creates a tenant and an E2B API key for it.
func (s *server) e2bKey(tenant string) string {
	s.t.Helper()
	s.mustCLI("tenant", "create", tenant)
	out := strings.Fields(s.mustCLI("token", "create", "--tenant", tenant, "--e2b"))
	if len(out) == 0 || !strings.HasPrefix(out[len(out)-1], "e2b_") {
		s.t.Fatalf("token create printed no e2b_ key: %q", out)
	}
	return out[len(out)-1]
}

func mountsBelow(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir) {
			out = append(out, f[4])
		}
	}
	return out
}

// cgroupsOf returns the cgroup directories (any controller, any depth up
// to 4) named after one of ids.
func cgroupsOf(ids []string) []string {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	var out []string
	var walk func(dir string, depth int)
	walk = func(dir string, depth int) {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			p := filepath.Join(dir, e.Name())
			if want[e.Name()] {
				out = append(out, p)
			}
			if depth < 4 {
				walk(p, depth+1)
			}
		}
	}
	walk("/sys/fs/cgroup", 0)
	return out
}

// sdkDir returns a directory whose node_modules holds the pinned e2b SDK,
// installed once with npm into $HOME/.cache/dsec-e2b-npm and reused.
func sdkDir(t testing.TB) string {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is required for the E2B SDK test (make deps installs Node.js): %v", tool, err)
		}
	}
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(home, ".cache", "dsec-e2b-npm", "e2b-"+sdkVersion)
	if _, err := os.Stat(filepath.Join(cache, "node_modules", "e2b", "package.json")); err == nil {
		return cache
	}
	if err := os.MkdirAll(filepath.Dir(cache), 0o755); err != nil {
		t.Fatal(err)
	}
	// Install into a fresh directory and rename it into place, so an
	// interrupted install never leaves a half-filled cache behind.
	tmp, err := os.MkdirTemp(filepath.Dir(cache), ".install-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	if err := os.WriteFile(filepath.Join(tmp, "package.json"), []byte(`{"private":true}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "install", "--no-audit", "--no-fund", "--save-exact", "e2b@"+sdkVersion)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm install e2b@%s: %v\n%s", sdkVersion, err, out)
	}
	if err := os.Rename(tmp, cache); err != nil {
		// Another test run won the race: use its install.
		if _, serr := os.Stat(filepath.Join(cache, "node_modules", "e2b", "package.json")); serr != nil {
			t.Fatal(err)
		}
	}
	return cache
}

// runNode runs one of this directory's scripts with the SDK installed
// next to it and the E2B environment pointing at s.
func (s *server) runNode(ctx context.Context, key, script string, args ...string) (stdout, stderr string, err error) {
	s.t.Helper()
	mods := sdkDir(s.t)
	work := filepath.Join(s.dir, "node")
	if err := os.MkdirAll(work, 0o755); err != nil {
		s.t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(repoRoot, "test", "e2b", script))
	if err != nil {
		s.t.Fatal(err)
	}
	// Node resolves "e2b" next to the script, so the script runs from a
	// directory whose node_modules is the cached install.
	if err := os.WriteFile(filepath.Join(work, script), src, 0o644); err != nil {
		s.t.Fatal(err)
	}
	link := filepath.Join(work, "node_modules")
	if _, err := os.Lstat(link); err != nil {
		if err := os.Symlink(filepath.Join(mods, "node_modules"), link); err != nil {
			s.t.Fatal(err)
		}
	}
	cmd := exec.CommandContext(ctx, "node", append([]string{filepath.Join(work, script)}, args...)...)
	cmd.Dir = work
	cmd.Env = append(os.Environ(),
		"E2B_API_URL="+s.e2bURL,
		"E2B_SANDBOX_URL="+s.e2bURL,
		"E2B_API_KEY="+key,
		"E2B_DOMAIN=dsec.invalid",
		"DSEC_E2B_TEMPLATE="+template,
	)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}
