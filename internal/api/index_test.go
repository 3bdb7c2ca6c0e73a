package api

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/store"
)

// usageFromStore is what every tenant holds by a full read of the records:
// the figures the in-memory index must agree with.
func usageFromStore(t *testing.T, st store.Reader) map[string]usage {
	t.Helper()
	out := map[string]usage{}
	recs, err := store.ListAll[sandboxRecord](context.Background(), st, store.BucketSandboxes, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if !holdsResources(r.Sandbox.State) {
			continue
		}
		u := out[r.Sandbox.Spec.Tenant]
		u.Sandboxes++
		u.CPU += r.Sandbox.Spec.CPU
		u.MemoryBytes += r.Sandbox.Spec.MemoryBytes
		u.DiskBytes += r.Sandbox.Spec.DiskBytes
		out[r.Sandbox.Spec.Tenant] = u
	}
	return out
}

func checkIndexMatchesStore(t *testing.T, e *env) {
	t.Helper()
	want := usageFromStore(t, e.st)
	for _, tenant := range []string{"alice", "bob", AdminTenant} {
		got, w := e.svc.index.tenantUsage(tenant), want[tenant]
		if got.Sandboxes != w.Sandboxes || got.MemoryBytes != w.MemoryBytes || got.DiskBytes != w.DiskBytes ||
			got.CPU < w.CPU-1e-9 || got.CPU > w.CPU+1e-9 {
			t.Fatalf("tenant %s: index holds %+v, the store's records %+v", tenant, got, w)
		}
	}
}

// The index follows every change of a record: creates, pauses, deaths
// noticed by a read, deletes, timers and a restart.
func TestIndexFollowsRecords(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	bob := e.tenant("bob", Quota{})
	ctx := context.Background()
	a1 := e.create(alice, node.SandboxSpec{CPU: 1, MemoryBytes: 1 << 30})
	a2 := e.create(alice, node.SandboxSpec{CPU: 0.5, MemoryBytes: 256 << 20, MaxLifetime: time.Minute})
	b1 := e.create(bob, node.SandboxSpec{CPU: 2, MemoryBytes: 64 << 20, DiskBytes: 1 << 30})
	checkIndexMatchesStore(t, e)

	e.doJSON("POST", "/v1/sandboxes/"+a1.ID+"/pause", alice, nil, http.StatusNoContent, nil)
	checkIndexMatchesStore(t, e)
	e.node.Kill(b1.ID, "init was OOM-killed")
	var got node.Sandbox
	e.doJSON("GET", "/v1/sandboxes/"+b1.ID, bob, nil, http.StatusOK, &got)
	if got.State != node.StateDead {
		t.Fatalf("killed sandbox is %s", got.State)
	}
	checkIndexMatchesStore(t, e) // a dead sandbox holds nothing
	e.clock.Advance(2 * time.Minute)
	if err := e.svc.ReapExpired(ctx); err != nil {
		t.Fatal(err)
	}
	if e.node.Has(a2.ID) {
		t.Fatal("sandbox past its lifetime kept")
	}
	checkIndexMatchesStore(t, e)
	e.doJSON("DELETE", "/v1/sandboxes/"+b1.ID, bob, nil, http.StatusNoContent, nil)
	checkIndexMatchesStore(t, e)

	e.stop()
	orphan, err := e.node.CreateSandbox(ctx, node.SandboxSpec{ID: "sb-orphan", Tenant: "bob", Image: "base:latest", CPU: 0.25, MemoryBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	e.start()
	checkIndexMatchesStore(t, e) // rebuilt from the store, the orphan adopted
	if u := e.svc.index.tenantUsage("bob"); u.Sandboxes != 1 {
		t.Fatalf("bob after adopting %s: %+v", orphan.ID, u)
	}
}

// A quota counts the sandboxes recorded before a restart, and a refused or
// failed create leaves nothing counted.
func TestQuotaAcrossRestart(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{Sandboxes: 2})
	e.create(alice, node.SandboxSpec{})
	second := e.create(alice, node.SandboxSpec{})
	e.stop()
	e.start()
	if r := e.do("POST", "/v1/sandboxes", alice, `{"image":"base"}`); r.status != http.StatusTooManyRequests {
		t.Fatalf("third sandbox over a quota of 2 after a restart: %d %s", r.status, r.body)
	}
	e.doJSON("DELETE", "/v1/sandboxes/"+second.ID, alice, nil, http.StatusNoContent, nil)
	e.create(alice, node.SandboxSpec{})
	checkIndexMatchesStore(t, e)
}

// While its node creates it, a sandbox is visible as creating, counts
// against its tenant, and can be neither deleted nor orphaned by deleting
// its tenant.
func TestCreateInFlight(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{Sandboxes: 2})
	e.node.CreateDelay = time.Second
	done := make(chan reply, 1)
	go func() { done <- e.do("POST", "/v1/sandboxes", alice, `{"id":"sb-slow","image":"base"}`) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := e.do("GET", "/v1/sandboxes/sb-slow", alice, nil)
		if r.status == http.StatusOK {
			var sb node.Sandbox
			if err := json.Unmarshal(r.body, &sb); err != nil {
				t.Fatal(err)
			}
			if sb.State != node.StateCreating {
				t.Fatalf("sandbox in creation reported as %s", sb.State)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox in creation not visible: %d %s", r.status, r.body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var list []node.Sandbox
	e.doJSON("GET", "/v1/sandboxes", alice, nil, http.StatusOK, &list)
	if len(list) != 1 || list[0].ID != "sb-slow" || list[0].State != node.StateCreating {
		t.Fatalf("list while creating: %+v", list)
	}
	if r := e.do("DELETE", "/v1/sandboxes/sb-slow", alice, nil); r.status != http.StatusConflict {
		t.Fatalf("delete while creating: %d %s", r.status, r.body)
	}
	if r := e.do("DELETE", "/v1/tenants/alice", e.admin, nil); r.status != http.StatusConflict {
		t.Fatalf("deleting a tenant with a create in flight: %d %s", r.status, r.body)
	}
	var capy node.Capacity
	e.doJSON("POST", "/v1/capacity", alice, node.SandboxSpec{CPU: 0.1, MemoryBytes: 1 << 20}, http.StatusOK, &capy)
	if capy.Detail["quota_sandboxes"] != 1 {
		t.Fatalf("capacity while one create is in flight: %+v", capy)
	}
	if r := <-done; r.status != http.StatusCreated {
		t.Fatalf("slow create: %d %s", r.status, r.body)
	}
	var sb node.Sandbox
	e.doJSON("GET", "/v1/sandboxes/sb-slow", alice, nil, http.StatusOK, &sb)
	if sb.State != node.StateRunning {
		t.Fatalf("after its create: %s", sb.State)
	}
	if e.records() != 1 {
		t.Fatalf("%d records, want 1", e.records())
	}
	checkIndexMatchesStore(t, e)
}
