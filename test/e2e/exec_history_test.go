package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/client"
)

// A sandbox running exec after exec keeps the results and output of its
// newest ended execs only (--exec-history, --exec-output-kept): on the
// node's disk, in its records and in what the API lists. Kept output can
// be read again after the exec ended, from the SDK and the CLI, and the
// bounds hold across a server killed and started again.
func TestExecHistoryBounded(t *testing.T) {
	s := startServer(t, "--exec-history", "3", "--exec-output-kept", "1Mi")
	s.importTestImage("busybox:1")
	ctx := context.Background()
	c := s.client()
	sb, err := c.CreateSandbox(ctx, client.SandboxSpec{Image: "busybox:1"})
	if err != nil {
		t.Fatal(err)
	}
	run := func(shell string) string {
		t.Helper()
		var out bytes.Buffer
		sess, err := c.StartExec(ctx, client.ExecRequest{SandboxID: sb.ID, Shell: shell}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		if res, err := sess.Wait(&out, io.Discard); err != nil || res.ExitCode != 0 {
			t.Fatalf("%q: %+v %v", shell, res, err)
		}
		return sess.ExecID
	}
	output := func(execID string) (string, error) {
		t.Helper()
		rc, err := c.ExecOutput(ctx, sb.ID, execID, client.Stdout)
		if err != nil {
			return "", err
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		return string(b), err
	}
	// kept waits for the node's exec dirs (record, result, output) to
	// number want: the oldest are removed just after an exec's result is
	// sent.
	kept := func(want int) int {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			dirs, _ := filepath.Glob(filepath.Join(sb.Runtime.Dir, "execs", "*"))
			if len(dirs) == want || time.Now().After(deadline) {
				return len(dirs)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	listed := func() []string {
		t.Helper()
		execs, err := c.ListExecs(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, e := range execs {
			ids = append(ids, e.ExecID)
		}
		return ids
	}

	var ids []string
	for i := range 5 {
		ids = append(ids, run(fmt.Sprintf("echo run %d; echo to stderr >&2", i)))
	}
	if got, want := strings.Join(listed(), ","), strings.Join(ids[2:], ","); got != want {
		t.Fatalf("listed execs %s, want the newest three %s", got, want)
	}
	if n := kept(3); n != 3 {
		t.Fatalf("node keeps %d execs, want 3", n)
	}
	if _, err := os.Stat(filepath.Join(s.dataDir, "node", "meta", sb.ID+".execs")); !os.IsNotExist(err) {
		t.Fatalf("a file per exec in the node's records: %v", err)
	}
	if out, err := output(ids[4]); err != nil || out != "run 4\n" {
		t.Fatalf("kept stdout of the newest exec = %q, %v", out, err)
	}
	if _, err := output(ids[0]); !client.IsNotFound(err) {
		t.Fatalf("output of a forgotten exec: %v, want not found", err)
	}
	if got := s.mustCLI("sandbox", "output", sb.ID, ids[3], "--stderr"); got != "to stderr\n" {
		t.Fatalf("CLI output --stderr = %q", got)
	}
	if got := s.mustCLI("sandbox", "execs", sb.ID); strings.Count(got, "ended") != 3 || !strings.Contains(got, ids[4]) {
		t.Fatalf("CLI execs:\n%s", got)
	}

	// Two execs of 600 KiB each do not fit 1 MiB of kept output: the
	// older one's output is forgotten, the newest is kept whole.
	big1 := run("head -c 614400 /dev/zero")
	big2 := run("head -c 614400 /dev/zero")
	if out, err := output(big2); err != nil || len(out) != 614400 {
		t.Fatalf("newest big exec: %d bytes kept, %v", len(out), err)
	}
	if n := kept(1); n != 1 {
		t.Fatalf("after the big execs the node keeps %d execs, want 1", n)
	}
	if _, err := output(big1); !client.IsNotFound(err) {
		t.Fatalf("older big exec beyond the output budget: %v, want not found", err)
	}

	// A restarted server learns the history from disk and goes on
	// bounding it.
	s.kill()
	s.start()
	c = s.client()
	var after []string
	for i := range 3 {
		after = append(after, run(fmt.Sprintf("echo after %d", i)))
	}
	if n := kept(3); n != 3 {
		t.Fatalf("after a restart the node keeps %d execs, want 3", n)
	}
	if _, err := output(big2); !client.IsNotFound(err) {
		t.Fatalf("exec of the earlier server beyond the history: %v, want not found", err)
	}
	if got, want := strings.Join(listed(), ","), strings.Join(after, ","); got != want {
		t.Fatalf("listed after restart %s, want %s", got, want)
	}
	if _, err := os.Stat(filepath.Join(sb.Runtime.Dir, "execs", after[2])); err != nil {
		t.Fatalf("newest exec's output dir: %v", err)
	}

	// Deleting the sandbox takes along the exec records that servers
	// before 2026-11-30 kept beside its record (they were left behind for
	// good), and a start sweeps away those a delete left.
	records := filepath.Join(s.dataDir, "node", "meta", sb.ID+".execs")
	if err := os.MkdirAll(records, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(records, "0123456789abcdef.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(records); !os.IsNotExist(err) {
		t.Fatalf("exec records of a deleted sandbox: %v", err)
	}
	stray := filepath.Join(s.dataDir, "node", "meta", "sb-0123456789abcdef.execs")
	if err := os.MkdirAll(stray, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stray, "0123456789abcdef.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.kill()
	s.start()
	if _, err := os.Stat(stray); !os.IsNotExist(err) {
		t.Fatalf("exec records without a sandbox survived a start: %v", err)
	}
}
