package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/testutil"
)

// RepoRoot is the module's root directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Build compiles cmd/dsec into a temporary directory; cleanup removes it.
func Build() (bin string, cleanup func(), err error) {
	tmp, err := os.MkdirTemp("", "dsec-testenv-bin-")
	if err != nil {
		return "", nil, err
	}
	bin = filepath.Join(tmp, "dsec")
	if err := GoBuild(bin, "./cmd/dsec", nil); err != nil {
		os.RemoveAll(tmp)
		return "", nil, err
	}
	return bin, func() { os.RemoveAll(tmp) }, nil
}

// GoBuild runs `go build -o out pkg` in the repository with extra
// environment (CGO_ENABLED=0 for a static program, say).
func GoBuild(out, pkg string, env []string) error {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// Server is one running `dsec serve` with its own directory.
type Server struct {
	Bin     string
	Dir     string // everything of this server lives below
	DataDir string
	Socket  string // the unix socket's path
	Addr    string // unix://Socket
	TCPAddr string // host:port of the TCP listener, "" without WithTCP

	extra []string
	tcp   bool
	cmd   *exec.Cmd
	log   *tailBuffer
}

// Option configures a Server.
type Option func(*Server)

// WithArgs adds flags to `dsec serve`.
func WithArgs(args ...string) Option {
	return func(s *Server) { s.extra = append(s.extra, args...) }
}

// WithTCP adds a TCP listener on a free loopback port (bearer tokens).
func WithTCP() Option { return func(s *Server) { s.tcp = true } }

// New starts a server in a fresh directory. The caller must Close it.
func New(bin string, opts ...Option) (*Server, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("testenv: dsec serve needs root")
	}
	dir, err := os.MkdirTemp("", "dsec-testenv-")
	if err != nil {
		return nil, err
	}
	s := &Server{Bin: bin, Dir: dir, DataDir: filepath.Join(dir, "data"), Socket: filepath.Join(dir, "dsec.sock")}
	s.Addr = "unix://" + s.Socket
	for _, o := range opts {
		o(s)
	}
	if s.tcp {
		port, err := freePort()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		s.TCPAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	}
	if err := s.Start(); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// Start is New for one test: it fails t on error and closes the server in
// t.Cleanup.
func Start(t testing.TB, bin string, opts ...Option) *Server {
	t.Helper()
	testutil.RequiresRoot(t)
	s, err := New(bin, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log (tail):\n%s", s.Log())
		}
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start (re)starts the server process and waits until it answers.
func (s *Server) Start() error {
	args := []string{"serve", "--data-dir", s.DataDir, "--listen", s.Addr}
	if s.TCPAddr != "" {
		args = append(args, "--listen", "tcp://"+s.TCPAddr)
	}
	s.cmd = exec.Command(s.Bin, append(args, s.extra...)...)
	// A child that inherited the server's output (a stray process of a
	// broken test) must not make Wait hang after the server has exited.
	s.cmd.WaitDelay = 5 * time.Second
	if s.log == nil {
		s.log = &tailBuffer{max: 1 << 20}
	}
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		return err
	}
	c, err := s.NewClient()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Nodes(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: server did not come up: %v\n%s", err, s.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Pid is the server process's pid.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Log is the tail of the server's output.
func (s *Server) Log() string { return s.log.String() }

// Kill stops the server with SIGKILL, as a crash would.
func (s *Server) Kill() {
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	_ = s.cmd.Wait()
}

// Stop stops the server with SIGTERM, then SIGKILL after 20s.
func (s *Server) Stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		s.Kill()
	}
}

// Close deletes every sandbox, stops the server and the layer daemon and
// removes the directory. It reports mounts left below the directory (and
// detaches them).
func (s *Server) Close() error {
	if s.cmd != nil && s.cmd.Process != nil && s.cmd.ProcessState == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if c, err := s.NewClient(); err == nil {
			if sbs, err := c.ListSandboxes(ctx, nil, ""); err == nil {
				for _, sb := range sbs {
					_ = c.DeleteSandbox(ctx, sb.ID)
				}
			}
		}
		cancel()
		s.Stop()
	}
	// The layer daemon outlives a server by design; stop it here.
	_ = exec.Command(s.Bin, "layerd-stop", "--data-dir", s.DataDir).Run()
	err := UnmountBelow(s.Dir)
	if rerr := os.RemoveAll(s.Dir); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

// NewClient is an SDK client on the unix socket (the admin caller).
func (s *Server) NewClient(opts ...client.Option) (*client.Client, error) {
	return client.New(s.Addr, opts...)
}

// Client is NewClient for a test.
func (s *Server) Client(t testing.TB) *client.Client {
	t.Helper()
	c, err := s.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TCPClient is a client on the TCP listener with token (empty: none).
func (s *Server) TCPClient(t testing.TB, token string) *client.Client {
	t.Helper()
	if s.TCPAddr == "" {
		t.Fatal("testenv: server has no TCP listener (WithTCP)")
	}
	c, err := client.New("tcp://"+s.TCPAddr, client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Run runs the dsec CLI against this server; err is set only when the CLI
// could not run.
func (s *Server) Run(env []string, args ...string) (stdout, stderr string, code int, err error) {
	cmd := exec.Command(s.Bin, args...)
	cmd.Env = append(append(os.Environ(), "DSEC_ADDR="+s.Addr), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code, err = ee.ExitCode(), nil
	}
	return o.String(), e.String(), code, err
}

// CLI runs the CLI and fails t only when it could not run.
func (s *Server) CLI(t testing.TB, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	stdout, stderr, code, err := s.Run(nil, args...)
	if err != nil {
		t.Fatalf("dsec %v: %v", args, err)
	}
	return stdout, stderr, code
}

// MustCLI runs the CLI and fails t on a non-zero exit.
func (s *Server) MustCLI(t testing.TB, args ...string) string {
	t.Helper()
	out, errOut, code := s.CLI(t, args...)
	if code != 0 {
		t.Fatalf("dsec %s: exit %d: %s", strings.Join(args, " "), code, errOut)
	}
	return out
}

// ImportImage builds the small test rootfs (scripts/mkrootfs.sh), lets
// customize add to it (nil: nothing), and imports it as ref with the
// extra flags of `dsec image import` (--public, say).
func (s *Server) ImportImage(ref string, customize func(rootfs string) error, flags ...string) error {
	rootfs := filepath.Join(s.Dir, "rootfs-"+strings.NewReplacer(":", "-", "/", "-").Replace(ref))
	if err := MakeRootfs(rootfs); err != nil {
		return err
	}
	if customize != nil {
		if err := customize(rootfs); err != nil {
			return err
		}
	}
	_, errOut, code, err := s.Run(nil, append([]string{"image", "import", ref, rootfs}, flags...)...)
	if err == nil && code != 0 {
		err = fmt.Errorf("dsec image import %s: exit %d: %s", ref, code, errOut)
	}
	return err
}

// ImportTestImage is ImportImage of the plain test rootfs for a test.
func (s *Server) ImportTestImage(t testing.TB, ref string) {
	t.Helper()
	if err := s.ImportImage(ref, nil); err != nil {
		t.Fatal(err)
	}
}

// MakeRootfs builds the small real rootfs (busybox + bash) in dir.
func MakeRootfs(dir string) error {
	mk := exec.Command(filepath.Join(RepoRoot(), "scripts", "mkrootfs.sh"), dir)
	if out, err := mk.CombinedOutput(); err != nil {
		return fmt.Errorf("mkrootfs: %w\n%s", err, out)
	}
	return nil
}

// UnmountBelow detaches every mount below dir and reports them.
func UnmountBelow(dir string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var left []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir) {
			left = append(left, f[4])
			_ = syscall.Unmount(f[4], syscall.MNT_DETACH)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("testenv: left mounted: %v", left)
	}
	return nil
}

// RSS is the resident set size of a process in bytes (VmRSS).
func RSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) == 2 && f[1] == "kB" {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb << 10, err
			}
		}
	}
	return 0, fmt.Errorf("testenv: no VmRSS for pid %d", pid)
}

// tailBuffer keeps the last max bytes written; safe for concurrent use (the
// server's output is read while it is written, and a flood must not grow
// the test's memory).
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
