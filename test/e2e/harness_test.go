// Package e2e drives the real dsec binary: a server on a unix socket, the
// CLI and the Go SDK against it, real sandboxes on this machine. The
// harness lives in test/testenv, shared with test/misconduct; server
// below binds one to a test.
package e2e

import (
	"fmt"
	"os"
	"testing"

	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/test/testenv"
)

var dsecBin string // built once in TestMain

func TestMain(m *testing.M) {
	bin, cleanup, err := testenv.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	dsecBin = bin
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// server is a testenv.Server bound to one test.
type server struct {
	srv     *testenv.Server
	t       *testing.T
	dir     string
	dataDir string
	addr    string
	log     interface{ String() string }
}

type logView struct{ s *testenv.Server }

func (l logView) String() string { return l.s.Log() }

// startServer starts dsec serve in a fresh directory (extra: flags of
// serve) and registers its cleanup: every sandbox deleted, the server and
// the layer daemon stopped, nothing mounted below the directory.
func startServer(t *testing.T, extra ...string) *server {
	t.Helper()
	srv := testenv.Start(t, dsecBin, testenv.WithArgs(extra...))
	return &server{srv: srv, t: t, dir: srv.Dir, dataDir: srv.DataDir, addr: srv.Addr, log: logView{srv}}
}

func (s *server) start() {
	s.t.Helper()
	if err := s.srv.Start(); err != nil {
		s.t.Fatal(err)
	}
}

// kill stops the server with SIGKILL, as a crash would.
func (s *server) kill() { s.srv.Kill() }

func (s *server) stop() { s.srv.Stop() }

func (s *server) client() *client.Client { return s.srv.Client(s.t) }

// cli runs the dsec CLI against this server.
func (s *server) cli(args ...string) (stdout, stderr string, code int) {
	s.t.Helper()
	return s.srv.CLI(s.t, args...)
}

// mustCLI runs the CLI and fails the test on a non-zero exit.
func (s *server) mustCLI(args ...string) string {
	s.t.Helper()
	return s.srv.MustCLI(s.t, args...)
}

// importTestImage builds the small real rootfs and imports it as ref.
func (s *server) importTestImage(ref string) {
	s.t.Helper()
	s.srv.ImportTestImage(s.t, ref)
}

var repoRoot = testenv.RepoRoot()
