package runtime_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/runtime"
	"github.com/dsec-dev/dsec/internal/runtime/runtimetest"
)

// helperOutput is what the fake server prints before it is killed.
type helperOutput struct {
	State  runtime.State `json:"state"`
	ExecID string        `json:"exec_id"`
}

// TestHelperServer is not a test: TestAdoptAfterServerRestart runs the
// test binary with DSEC_HELPER_SERVER set to play a server that creates a
// sandbox, starts a background exec and is then killed.
func TestHelperServer(t *testing.T) {
	if os.Getenv("DSEC_HELPER_SERVER") == "" {
		t.Skip("helper process only")
	}
	cg := runtimetest.Cgroups(t)
	rt, err := runtime.NewNamespaceRuntime(cg, runtime.WithCgroupParent(os.Getenv("DSEC_HELPER_PARENT")))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := rt.Create(ctx, runtime.Spec{ID: "adopted", Dir: os.Getenv("DSEC_HELPER_DIR"), Lower: []string{os.Getenv("DSEC_HELPER_LOWER")}, Env: []string{"WHO=adopted"}})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := rt.Start(ctx, "adopted", runtime.Process{Args: []string{"sh", "-c", "echo begin; sleep 1; echo $WHO end"}}, runtime.IO{Stdout: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(helperOutput{State: *st, ExecID: ex.ID()})
	fmt.Printf("%s\n", b)
	time.Sleep(time.Minute) // killed before
}

func TestAdoptAfterServerRestart(t *testing.T) {
	e := newEnv(t)
	dir := filepath.Join(e.base, "adopted")
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperServer$", "-test.count=1")
	cmd.Env = append(os.Environ(), "DSEC_HELPER_SERVER=1", "DSEC_HELPER_PARENT="+e.parent, "DSEC_HELPER_DIR="+dir, "DSEC_HELPER_LOWER="+lowerDir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var h helperOutput
	line, err := bufio.NewReader(out).ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &h)
	}
	// The server dies with its whole process group, as on a crash or ^C.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Wait()
	if err != nil {
		t.Fatalf("helper: %v (%q)", err, line)
	}
	t.Cleanup(func() { _ = e.rt.Destroy(context.Background(), "adopted") })

	// Bad states are refused without harm.
	bad := h.State
	bad.PidStart++
	if err := e.rt.Adopt(context.Background(), bad); !errdefs.IsNotFound(err) {
		t.Fatalf("adopt with wrong start time: %v", err)
	}
	bad = h.State
	bad.Cgroup = e.parent + "/missing"
	if err := e.rt.Adopt(context.Background(), bad); !errdefs.IsNotFound(err) {
		t.Fatalf("adopt with missing cgroup: %v", err)
	}
	bad = h.State
	bad.Pid = 0
	if err := e.rt.Adopt(context.Background(), bad); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("adopt with pid 0: %v", err)
	}

	if err := e.rt.Adopt(context.Background(), h.State); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.Adopt(context.Background(), h.State); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second adopt: %v", err)
	}
	if !e.rt.Alive("adopted") {
		t.Fatal("init did not survive the server")
	}
	// The exec started by the dead server finishes and its result is kept.
	deadline := time.Now().Add(10 * time.Second)
	var res *runtime.ExecResult
	for {
		var done bool
		res, done, err = e.rt.ExecResult("adopted", h.ExecID)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("background exec did not finish")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if res.ExitCode != 0 || res.Signal != "" {
		t.Fatalf("background exec result %+v", res)
	}
	kept, err := e.rt.ExecOutput("adopted", h.ExecID, "stdout")
	if err != nil || string(kept) != "begin\nadopted end\n" {
		t.Fatalf("kept output %q %v", kept, err)
	}
	// New execs keep the sandbox's environment.
	if got := e.mustSh("adopted", "echo $WHO; hostname"); got != "adopted\nadopted\n" {
		t.Fatalf("%q", got)
	}
	paths := e.groupPaths(&h.State)
	if err := e.rt.Destroy(context.Background(), "adopted"); err != nil {
		t.Fatal(err)
	}
	e.assertGone(&h.State, paths)
	if err := e.rt.Adopt(context.Background(), h.State); !errdefs.IsNotFound(err) {
		t.Fatalf("adopt of a destroyed sandbox: %v", err)
	}
}

// TestAdoptInProcess drops the Runtime object and adopts from the
// persisted State in a new one.
func TestAdoptInProcess(t *testing.T) {
	e := newEnv(t)
	st := e.create("reborn")
	ex, err := e.rt.Start(context.Background(), "reborn", runtime.Process{Args: []string{"sh", "-c", "sleep 0.5; exit 4"}}, runtime.IO{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(st)
	var st2 runtime.State
	if err := json.Unmarshal(b, &st2); err != nil {
		t.Fatal(err)
	}
	rt2, err := runtime.NewNamespaceRuntime(e.cg, runtime.WithCgroupParent(e.parent))
	if err != nil {
		t.Fatal(err)
	}
	defer rt2.Close()
	if err := rt2.Adopt(context.Background(), st2); err != nil {
		t.Fatal(err)
	}
	r, err := ex.Wait(context.Background())
	if err != nil || r.ExitCode != 4 {
		t.Fatalf("%+v %v", r, err)
	}
	r2, done, err := rt2.ExecResult("reborn", ex.ID())
	if err != nil || !done || r2.ExitCode != 4 {
		t.Fatalf("%+v %v %v", r2, done, err)
	}
	e.rt = rt2 // the env's cleanup destroys through the new runtime
	if err := rt2.Destroy(context.Background(), "reborn"); err != nil {
		t.Fatal(err)
	}
}

// TestExecShimKilled: an exec whose shim dies without recording a result
// is reported as unavailable, not as running forever.
func TestExecShimKilled(t *testing.T) {
	e := newEnv(t)
	e.create("shimkill")
	ex, err := e.rt.Start(context.Background(), "shimkill", runtime.Process{Args: []string{"sleep", "30"}}, runtime.IO{})
	if err != nil {
		t.Fatal(err)
	}
	if _, done, err := e.rt.ExecResult("shimkill", ex.ID()); done || err != nil {
		t.Fatalf("running exec: done %v err %v", done, err)
	}
	b, err := os.ReadFile(filepath.Join(e.base, "shimkill", "execs", ex.ID(), "result.json.tmp"))
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	var start uint64
	if _, err := fmt.Sscanf(string(b), "running %d %d", &pid, &start); err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := ex.Wait(context.Background()); !errdefs.IsUnavailable(err) {
		t.Fatalf("wait: %v", err)
	}
	if _, _, err := e.rt.ExecResult("shimkill", ex.ID()); !errdefs.IsUnavailable(err) {
		t.Fatalf("ExecResult: %v", err)
	}
	_ = ex.Signal(syscall.SIGKILL)
}
