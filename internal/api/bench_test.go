package api

import (
	"context"
	"testing"

	"github.com/dsec-dev/dsec/internal/node"
)

// BenchmarkCreateDelete measures the control plane's own cost per sandbox
// (validation, quota reservation, store writes, audit) over a fake node.
func BenchmarkCreateDelete(b *testing.B) {
	e := newEnv(b)
	e.tenant("alice", Quota{Sandboxes: 10, CPU: 10, MemoryBytes: 10 << 30})
	c := Caller{Tenant: "alice"}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		sb, err := e.svc.CreateSandbox(ctx, c, node.SandboxSpec{Image: "base", CPU: 0.5, MemoryBytes: 64 << 20})
		if err != nil {
			b.Fatal(err)
		}
		if err := e.svc.DeleteSandbox(ctx, c, sb.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExecHTTP is one short exec through the HTTP face: request line,
// NDJSON frames, result.
func BenchmarkExecHTTP(b *testing.B) {
	e := newEnv(b)
	alice := e.tenant("alice", Quota{})
	sb := e.create(alice, node.SandboxSpec{})
	b.ReportAllocs()
	for b.Loop() {
		r := e.doExec(alice, sb.ID, node.ExecRequest{Args: []string{"echo", "x"}}, "")
		if r.result == nil {
			b.Fatalf("exec: %+v", r)
		}
	}
}

func BenchmarkAuthenticate(b *testing.B) {
	e := newEnv(b)
	tok := e.tenant("alice", Quota{})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.svc.Authenticate(ctx, tok); err != nil {
			b.Fatal(err)
		}
	}
}
