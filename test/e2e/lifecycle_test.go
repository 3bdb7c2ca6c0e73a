package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/client"
)

func sandboxCgroupsLeft(t *testing.T, ids ...string) []string {
	t.Helper()
	var left []string
	for _, ctrl := range []string{"memory", "pids", "cpu", "freezer"} {
		for _, id := range ids {
			matches, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", ctrl, "dsec*", "**", id))
			m2, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", ctrl, "dsec*", id))
			left = append(left, append(matches, m2...)...)
		}
	}
	return left
}

// processesWithHostname lists host pids whose UTS hostname is id: the
// processes of that sandbox.
func processesOf(t *testing.T, initPid int) bool {
	t.Helper()
	if initPid <= 0 {
		return false
	}
	return syscall.Kill(initPid, 0) == nil
}

func TestCLILifecycle(t *testing.T) {
	s := startServer(t)
	s.importTestImage("busybox:1")

	out := s.mustCLI("image", "ls", "--json")
	if !strings.Contains(out, "busybox:1") {
		t.Fatalf("image ls: %s", out)
	}

	id := strings.TrimSpace(s.mustCLI("sandbox", "create", "--image", "busybox:1", "--memory", "128Mi", "--pids", "128", "--label", "suite=e2e"))
	if !strings.HasPrefix(id, "sb-") {
		t.Fatalf("create printed %q", id)
	}

	// exec streams output and exits with the command's code.
	stdout, _, code := s.cli("exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
	if code != 7 || stdout != "out\n" {
		t.Fatalf("exec: code %d stdout %q", code, stdout)
	}
	if got := s.mustCLI("exec", id, "--", "hostname"); strings.TrimSpace(got) != id {
		t.Fatalf("hostname %q, want %q", got, id)
	}
	if got := s.mustCLI("exec", id, "--cwd", "/tmp", "--env", "A=b", "--", "sh", "-c", "pwd; echo $A"); got != "/tmp\nb\n" {
		t.Fatalf("cwd/env: %q", got)
	}
	if got := s.mustCLI("exec", id, "--user", "user", "--", "id", "-u"); strings.TrimSpace(got) != "1000" {
		t.Fatalf("user: %q", got)
	}
	_, errOut, code := s.cli("exec", id, "--timeout", "500ms", "--", "sleep", "30")
	if code == 0 {
		t.Fatalf("timeout did not kill: %s", errOut)
	}

	// Files: put, get, ls, rm; the image itself is never changed.
	local := filepath.Join(s.dir, "hello.txt")
	if err := os.WriteFile(local, []byte("hello sandbox\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s.mustCLI("file", "put", id, local, "/workspace/hello.txt")
	if got := s.mustCLI("exec", id, "--", "cat", "/workspace/hello.txt"); got != "hello sandbox\n" {
		t.Fatalf("put then cat: %q", got)
	}
	s.mustCLI("exec", id, "--", "sh", "-c", "echo changed > /workspace/README")
	back := filepath.Join(s.dir, "back.txt")
	s.mustCLI("file", "get", id, "/workspace/README", back)
	if b, _ := os.ReadFile(back); string(b) != "changed\n" {
		t.Fatalf("get: %q", b)
	}
	if ls := s.mustCLI("file", "ls", id, "/workspace"); !strings.Contains(ls, "hello.txt") {
		t.Fatalf("ls: %s", ls)
	}
	s.mustCLI("file", "rm", id, "/workspace/hello.txt")
	if _, _, code := s.cli("exec", id, "--", "test", "-e", "/workspace/hello.txt"); code == 0 {
		t.Fatal("file rm left the file")
	}
	other := strings.TrimSpace(s.mustCLI("sandbox", "create", "--image", "busybox:1"))
	if got := s.mustCLI("exec", other, "--", "cat", "/workspace/README"); got != "hello from the image\n" {
		t.Fatalf("another sandbox sees %q: writes leaked into the image", got)
	}

	// Pause keeps processes and files; resume continues them.
	s.mustCLI("exec", id, "--", "sh", "-c", "(i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.1; done) >/dev/null 2>&1 &")
	time.Sleep(500 * time.Millisecond)
	s.mustCLI("sandbox", "pause", id)
	var sb client.Sandbox
	if err := json.Unmarshal([]byte(s.mustCLI("sandbox", "inspect", id, "--json")), &sb); err != nil {
		t.Fatal(err)
	}
	if sb.State != "paused" {
		t.Fatalf("state after pause: %s", sb.State)
	}
	if _, _, code := s.cli("exec", id, "--", "true"); code == 0 {
		t.Fatal("exec in a paused sandbox succeeded")
	}
	s.mustCLI("sandbox", "resume", id)
	c1, _ := strconv.Atoi(strings.TrimSpace(s.mustCLI("exec", id, "--", "cat", "/tmp/counter")))
	time.Sleep(500 * time.Millisecond)
	c2, _ := strconv.Atoi(strings.TrimSpace(s.mustCLI("exec", id, "--", "cat", "/tmp/counter")))
	if c1 == 0 || c2 <= c1 {
		t.Fatalf("background process did not survive pause/resume: %d then %d", c1, c2)
	}

	// ls by label, then rm leaves no cgroup and no process.
	if ls := s.mustCLI("sandbox", "ls", "--label", "suite=e2e"); !strings.Contains(ls, id) || strings.Contains(ls, other) {
		t.Fatalf("ls by label: %s", ls)
	}
	s.mustCLI("sandbox", "rm", id, other)
	if left := sandboxCgroupsLeft(t, id, other); len(left) > 0 {
		t.Fatalf("cgroups left: %v", left)
	}
	if processesOf(t, sb.Runtime.Pid) {
		t.Fatalf("init %d still runs after rm", sb.Runtime.Pid)
	}
	if _, errOut, code := s.cli("sandbox", "inspect", id); code == 0 || !strings.Contains(errOut, "not found") {
		t.Fatalf("inspect after rm: code %d %s", code, errOut)
	}
}

func TestCLIErrorsAreOneLine(t *testing.T) {
	s := startServer(t)
	for _, args := range [][]string{
		{"sandbox", "inspect", "sb-doesnotexist"},
		{"sandbox", "create", "--image", "no-such-image:1"},
		{"exec", "sb-doesnotexist", "--", "true"},
		{"sandbox", "create", "--image", "x", "--memory", "lots"},
	} {
		_, errOut, code := s.cli(args...)
		if code == 0 {
			t.Errorf("dsec %v succeeded", args)
			continue
		}
		if n := strings.Count(strings.TrimSpace(errOut), "\n"); n != 0 || !strings.HasPrefix(errOut, "dsec: ") {
			t.Errorf("dsec %v: error is not one clear line: %q", args, errOut)
		}
	}
}

// A killed server (SIGKILL) leaves its sandboxes running; started again it
// adopts them: nothing lost, not the sandbox, not a file, not the result of
// an exec that finished while no server ran.
func TestServerKilledAndRestartedAdoptsSandboxes(t *testing.T) {
	s := startServer(t)
	s.importTestImage("busybox:1")
	ctx := context.Background()
	c := s.client()
	sb, err := c.CreateSandbox(ctx, client.SandboxSpec{Image: "busybox:1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteFile(ctx, sb.ID, "/workspace/state.txt", 0o644, strings.NewReader("kept")); err != nil {
		t.Fatal(err)
	}
	// An exec still running when the server dies, finishing while it is down.
	sess, err := c.StartExec(ctx, client.ExecRequest{SandboxID: sb.ID, Shell: "sleep 1; echo finished > /workspace/late.txt; echo done; exit 3"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	execID, execPid := sess.ExecID, sess.Pid
	dead, err := c.CreateSandbox(ctx, client.SandboxSpec{Image: "busybox:1"})
	if err != nil {
		t.Fatal(err)
	}

	s.kill()
	// While no server runs, one sandbox's processes die.
	if err := syscall.Kill(dead.Runtime.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	s.start()
	c = s.client()

	got, err := c.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatalf("sandbox lost after restart: %v", err)
	}
	if got.State != "running" {
		t.Fatalf("adopted sandbox is %s", got.State)
	}
	var out bytes.Buffer
	res, err := c.Exec(ctx, client.ExecRequest{SandboxID: sb.ID, Args: []string{"cat", "/workspace/state.txt", "/workspace/late.txt"}}, nil, &out, &out)
	if err != nil || res.ExitCode != 0 || out.String() != "keptfinished\n" {
		t.Fatalf("after restart: %v %+v %q", err, res, out.String())
	}
	if info, err := c.GetExec(ctx, sb.ID, execID); err != nil || info.Pid != execPid || info.Request.Shell == "" {
		t.Fatalf("exec of the earlier server: %+v %v; want pid %d and its request", info, err, execPid)
	}
	r, err := c.WaitExec(ctx, sb.ID, execID)
	if err != nil {
		t.Fatalf("exec result lost: %v", err)
	}
	if r.ExitCode != 3 {
		t.Fatalf("exec result after restart: %+v", r)
	}
	d, err := c.GetSandbox(ctx, dead.ID)
	if err != nil {
		t.Fatalf("dead sandbox silently dropped: %v", err)
	}
	if d.State != "dead" || d.Reason == "" {
		t.Fatalf("dead sandbox reported as %s (%q)", d.State, d.Reason)
	}
	if err := c.DeleteSandbox(ctx, dead.ID); err != nil {
		t.Fatalf("deleting a dead sandbox: %v", err)
	}
	if left := sandboxCgroupsLeft(t, dead.ID); len(left) > 0 {
		t.Fatalf("deleting a dead sandbox left its cgroups: %v", left)
	}
	if _, err := os.Stat(dead.Runtime.Dir); !os.IsNotExist(err) {
		t.Fatalf("deleting a dead sandbox left its directory %s: %v", dead.Runtime.Dir, err)
	}
}

// A server killed between the runtime's create and the node's record of a
// sandbox (the record is written once, when the sandbox runs) leaves a
// sandbox directory, cgroups and processes without a record: the next
// start removes them, and the control plane reports the sandbox dead.
func TestRestartRemovesSandboxWithoutNodeRecord(t *testing.T) {
	s := startServer(t)
	s.importTestImage("busybox:1")
	ctx := context.Background()
	c := s.client()
	kept, err := c.CreateSandbox(ctx, client.SandboxSpec{Image: "busybox:1"})
	if err != nil {
		t.Fatal(err)
	}
	cut, err := c.CreateSandbox(ctx, client.SandboxSpec{Image: "busybox:1"})
	if err != nil {
		t.Fatal(err)
	}
	s.kill()
	if err := os.Remove(filepath.Join(s.dataDir, "node", "meta", cut.ID+".json")); err != nil {
		t.Fatal(err)
	}
	s.start()
	c = s.client()

	// Killed; it may stay a zombie until the host's init reaps it (and
	// its pid may be someone else's by then: the start time tells).
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(cut.Runtime.Pid) + "/stat"); err == nil {
		f := strings.Fields(string(b)[strings.LastIndexByte(string(b), ')')+2:])
		if len(f) > 19 && f[0] != "Z" && f[0] != "X" && f[19] == strconv.FormatUint(cut.Runtime.PidStart, 10) {
			t.Fatalf("the init (pid %d) of the sandbox without a record still runs: %s", cut.Runtime.Pid, b)
		}
	}
	if left := sandboxCgroupsLeft(t, cut.ID); len(left) > 0 {
		t.Fatalf("cgroups of the sandbox without a record left: %v", left)
	}
	if _, err := os.Stat(cut.Runtime.Dir); !os.IsNotExist(err) {
		t.Fatalf("directory of the sandbox without a record left: %s: %v", cut.Runtime.Dir, err)
	}
	got, err := c.GetSandbox(ctx, cut.ID)
	if err != nil || got.State != "dead" || got.Reason == "" {
		t.Fatalf("sandbox without a node record: %+v %v, want dead with a reason", got, err)
	}
	if err := c.DeleteSandbox(ctx, cut.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := c.GetSandbox(ctx, kept.ID); err != nil || got.State != "running" {
		t.Fatalf("the other sandbox after the restart: %+v %v", got, err)
	}
	var out bytes.Buffer
	if res, err := c.Exec(ctx, client.ExecRequest{SandboxID: kept.ID, Args: []string{"true"}}, nil, &out, &out); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec in the other sandbox: %v %+v %s", err, res, out.String())
	}
}
