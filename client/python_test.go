package client_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/client/clienttest"
)

// TestPythonClientAgainstHandler runs the Python client's server suite
// (python/tests) against the in-process contract server, over a unix
// socket and over TCP with a token, so the Python wire format is checked
// against the same handler shape the Go SDK uses.
func TestPythonClientAgainstHandler(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed")
	}
	dir, err := filepath.Abs("../python")
	if err != nil {
		t.Fatal(err)
	}
	for _, unix := range []bool{true, false} {
		name := map[bool]string{true: "unix", false: "tcp"}[unix]
		t.Run(name, func(t *testing.T) {
			srv := clienttest.NewServer(t, clienttest.ServerOptions{Unix: unix, Images: []string{"base"}})
			token := ""
			if !unix {
				token = srv.Service.AdminToken()
			}
			cmd := exec.CommandContext(t.Context(), py, "-m", "unittest", "discover", "-s", "tests", "-v")
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "DSEC_ADDR="+srv.Addr, "DSEC_TOKEN="+token,
				"DSEC_TEST_IMAGE=base", "DSEC_REQUIRE_SERVER=1", "PYTHONDONTWRITEBYTECODE=1")
			cmd.WaitDelay = 10 * time.Second
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("python suite failed: %v\n%s", err, out)
			}
			t.Logf("%s", out)
		})
	}
}
