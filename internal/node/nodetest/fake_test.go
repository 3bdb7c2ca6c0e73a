package nodetest

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/runtime"
)

func TestFakeKeepsTheAgentContract(t *testing.T) {
	ctx := context.Background()
	f := New("n", t.TempDir(), 2, 1<<30)
	spec := node.SandboxSpec{ID: "a", Image: "img", CPU: 1, MemoryBytes: 512 << 20}
	if _, err := f.CreateSandbox(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if _, err := f.CreateSandbox(ctx, spec); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("duplicate id: %v", err)
	}
	big := node.SandboxSpec{ID: "b", Image: "img", CPU: 0.5, MemoryBytes: 1 << 30}
	if _, err := f.CreateSandbox(ctx, big); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "memory") {
		t.Fatalf("over capacity: %v", err)
	}
	capy, _ := f.Capacity(ctx, node.SandboxSpec{CPU: 1, MemoryBytes: 256 << 20})
	if capy.Fits != 1 || capy.LimitingResource != "cpu" {
		t.Fatalf("capacity: %+v", capy)
	}
	if err := f.ResumeSandbox(ctx, "a"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("resume running: %v", err)
	}
	if err := f.PauseSandbox(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.StartExec(ctx, node.ExecRequest{SandboxID: "a", Args: []string{"echo"}}, runtime.IO{}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("exec on paused: %v", err)
	}
	_ = f.ResumeSandbox(ctx, "a")
	var out bytes.Buffer
	info, err := f.StartExec(ctx, node.ExecRequest{SandboxID: "a", Args: []string{"cat"}}, runtime.IO{Stdin: strings.NewReader("in"), Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	res, err := f.WaitExec(ctx, "a", info.ExecID)
	if err != nil || res.ExitCode != 0 || out.String() != "in" {
		t.Fatalf("cat: %+v %v %q", res, err, out.String())
	}
	if _, err := f.WriteFile(ctx, "a", "/../../escape", 0o644, strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.StatFile(ctx, "a", "/escape"); err != nil {
		t.Fatalf("a rooted path did not stay inside the sandbox: %v", err)
	}
	if err := f.DeleteSandbox(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.GetSandbox(ctx, "a"); !errdefs.IsNotFound(err) {
		t.Fatalf("deleted: %v", err)
	}
}
