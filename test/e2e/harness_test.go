// Package e2e drives the real dsec binary: a server on a unix socket, the
// CLI and the Go SDK against it, real sandboxes on this machine.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/testutil"
)

var (
	dsecBin  string // built once in TestMain
	repoRoot string
)

func TestMain(m *testing.M) {
	_, file, _, _ := runtime.Caller(0)
	repoRoot = filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	tmp, err := os.MkdirTemp("", "dsec-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dsecBin = filepath.Join(tmp, "dsec")
	build := exec.Command("go", "build", "-o", dsecBin, "./cmd/dsec")
	build.Dir = repoRoot
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building dsec:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(tmp)
	os.Exit(code)
}

// server is one running `dsec serve` with its own data dir.
type server struct {
	t       *testing.T
	dir     string
	dataDir string
	addr    string
	cmd     *exec.Cmd
	log     *bytes.Buffer
	extra   []string
}

// startServer starts dsec serve in a fresh directory and registers its
// cleanup: every sandbox deleted, the server and the layer daemon stopped,
// nothing mounted below the directory.
func startServer(t *testing.T, extra ...string) *server {
	t.Helper()
	testutil.RequiresRoot(t)
	dir, err := os.MkdirTemp("", "dsec-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, dir: dir, dataDir: filepath.Join(dir, "data"), addr: "unix://" + filepath.Join(dir, "dsec.sock"), extra: extra}
	s.start()
	t.Cleanup(func() { s.cleanup() })
	return s
}

func (s *server) start() {
	s.t.Helper()
	args := append([]string{"serve", "--data-dir", s.dataDir, "--listen", s.addr}, s.extra...)
	s.cmd = exec.Command(dsecBin, args...)
	s.log = &bytes.Buffer{}
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	c := s.client()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Nodes(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("server did not come up: %v\n%s", err, s.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill stops the server with SIGKILL, as a crash would.
func (s *server) kill() {
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	_ = s.cmd.Wait()
}

func (s *server) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		s.kill()
	}
}

func (s *server) cleanup() {
	if s.cmd.ProcessState == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		c := s.client()
		if sbs, err := c.ListSandboxes(ctx, nil, ""); err == nil {
			for _, sb := range sbs {
				_ = c.DeleteSandbox(ctx, sb.ID)
			}
		}
		cancel()
		s.stop()
	}
	// The layer daemon outlives a server by design; stop it here.
	_ = exec.Command(dsecBin, "layerd-stop", "--data-dir", s.dataDir).Run()
	if s.t.Failed() {
		s.t.Logf("server log:\n%s", s.log.String())
	}
	assertNothingMountedBelow(s.t, s.dir)
	_ = os.RemoveAll(s.dir)
}

func (s *server) client() *client.Client {
	c, err := client.New(s.addr)
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// cli runs the dsec CLI against this server.
func (s *server) cli(args ...string) (stdout, stderr string, code int) {
	s.t.Helper()
	cmd := exec.Command(dsecBin, args...)
	cmd.Env = append(os.Environ(), "DSEC_ADDR="+s.addr)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		s.t.Fatalf("dsec %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

// mustCLI runs the CLI and fails the test on a non-zero exit.
func (s *server) mustCLI(args ...string) string {
	s.t.Helper()
	out, errOut, code := s.cli(args...)
	if code != 0 {
		s.t.Fatalf("dsec %s: exit %d: %s", strings.Join(args, " "), code, errOut)
	}
	return out
}

// importTestImage builds the small real rootfs and imports it as ref.
func (s *server) importTestImage(ref string) {
	s.t.Helper()
	rootfs := filepath.Join(s.dir, "rootfs-"+strings.NewReplacer(":", "-", "/", "-").Replace(ref))
	mk := exec.Command(filepath.Join(repoRoot, "scripts", "mkrootfs.sh"), rootfs)
	if out, err := mk.CombinedOutput(); err != nil {
		s.t.Fatalf("mkrootfs: %v\n%s", err, out)
	}
	s.mustCLI("image", "import", ref, rootfs)
}

func assertNothingMountedBelow(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir) {
			t.Errorf("left mounted: %s", f[4])
			_ = syscall.Unmount(f[4], syscall.MNT_DETACH)
		}
	}
}
