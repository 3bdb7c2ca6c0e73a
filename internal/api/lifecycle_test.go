package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/node/nodetest"
	"github.com/dsec-dev/dsec/internal/store"
)

func TestQuotaRefusalLeavesNothing(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{Sandboxes: 3, CPU: 3, MemoryBytes: 2 << 30, DiskBytes: 10 << 30})
	e.create(alice, node.SandboxSpec{CPU: 1, MemoryBytes: 1 << 30})
	cases := []struct {
		name string
		spec string
		res  string
	}{
		{"memory", `{"image":"base","cpu":1,"memory_bytes":2147483648}`, "memory"},
		{"cpu", `{"image":"base","cpu":2.5,"memory_bytes":1048576}`, "cpu"},
		{"disk", `{"image":"base","cpu":0.5,"memory_bytes":1048576,"disk_bytes":21474836480}`, "disk"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.do("POST", "/v1/sandboxes", alice, c.spec)
			if r.status != http.StatusTooManyRequests {
				t.Fatalf("status %d, want 429: %s", r.status, r.body)
			}
			eb := r.errBody(t)
			if eb.Code != CodeResourceExhausted || !strings.Contains(eb.Error, "quota exceeded: "+c.res) {
				t.Fatalf("error %+v, want the %s quota named", eb, c.res)
			}
			if e.node.Len() != 1 || e.records() != 1 {
				t.Fatalf("refusal left state: node %d, store %d", e.node.Len(), e.records())
			}
		})
	}
	e.create(alice, node.SandboxSpec{CPU: 1, MemoryBytes: 512 << 20})
	e.create(alice, node.SandboxSpec{CPU: 0.5, MemoryBytes: 256 << 20})
	if r := e.do("POST", "/v1/sandboxes", alice, `{"image":"base","cpu":0.1,"memory_bytes":1048576}`); r.status != 429 ||
		!strings.Contains(r.errBody(t).Error, "sandboxes") {
		t.Fatalf("count quota: %d %s", r.status, r.body)
	}
	// Capacity reports the quota as the limit.
	var capy node.Capacity
	e.doJSON("POST", "/v1/capacity", alice, node.SandboxSpec{CPU: 0.1, MemoryBytes: 1 << 20}, http.StatusOK, &capy)
	if capy.Fits != 0 || capy.LimitingResource != "quota_sandboxes" {
		t.Fatalf("capacity under quota: %+v", capy)
	}
}

func TestNodeRefusalNamesResource(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	r := e.do("POST", "/v1/sandboxes", alice, `{"image":"base","memory_bytes":34359738368}`)
	if r.status != 429 || !strings.Contains(r.errBody(t).Error, "memory") {
		t.Fatalf("oversized sandbox: %d %s", r.status, r.body)
	}
	if e.node.Len() != 0 || e.records() != 0 {
		t.Fatal("refusal left state")
	}
}

// A node that fails half-way (sandbox registered, error returned) is
// cleaned up, and the reservation is released.
func TestFailedCreateIsUndone(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{Sandboxes: 1})
	boom := fmt.Errorf("runtime exploded: %w", errdefs.ErrUnavailable)
	e.node.FailCreate = func(node.SandboxSpec) error { return boom }
	e.node.CreateLeaks = true
	r := e.do("POST", "/v1/sandboxes", alice, `{"image":"base"}`)
	if r.status != 503 || !strings.Contains(r.errBody(t).Error, "runtime exploded") {
		t.Fatalf("failed create: %d %s", r.status, r.body)
	}
	if e.node.Len() != 0 {
		t.Fatalf("the half-created sandbox was left on the node")
	}
	if e.records() != 0 {
		t.Fatal("the reservation was not released")
	}
	e.node.FailCreate = nil
	e.create(alice, node.SandboxSpec{}) // quota of 1 is free again
	// Unknown and private images are refused before anything is reserved.
	if r := e.do("POST", "/v1/sandboxes", e.admin, `{"image":"ghost:v1"}`); r.status != 404 {
		t.Fatalf("missing image: %d %s", r.status, r.body)
	}
	bob := e.tenant("bob", Quota{})
	if r := e.do("POST", "/v1/sandboxes", bob, `{"image":"other:v1"}`); r.status != 404 {
		t.Fatalf("admin's private image used by a tenant: %d %s", r.status, r.body)
	}
}

func TestConcurrentCreatesRespectQuota(t *testing.T) {
	e := newEnv(t)
	const quota, attempts = 5, 20
	alice := e.tenant("alice", Quota{Sandboxes: quota, CPU: 100})
	e.node.CreateDelay = 20 * time.Millisecond // widen the race window
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for i := 0; i < attempts; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := e.do("POST", "/v1/sandboxes", alice, `{"image":"base","cpu":0.1,"memory_bytes":1048576}`)
			mu.Lock()
			codes[r.status]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if codes[201] != quota || codes[429] != attempts-quota {
		t.Fatalf("status counts %v, want %d x 201 and %d x 429", codes, quota, attempts-quota)
	}
	if e.node.Len() != quota || e.records() != quota {
		t.Fatalf("node %d, store %d, want %d", e.node.Len(), e.records(), quota)
	}
}

func TestIdleTTL(t *testing.T) {
	for _, onIdle := range []string{"delete", "pause"} {
		t.Run(onIdle, func(t *testing.T) {
			e := newEnv(t)
			alice := e.tenant("alice", Quota{})
			sb := e.create(alice, node.SandboxSpec{IdleTTL: time.Minute, OnIdle: onIdle})
			ctx := context.Background()
			step := func(d time.Duration) {
				t.Helper()
				e.clock.Advance(d)
				if err := e.svc.ReapExpired(ctx); err != nil {
					t.Fatal(err)
				}
			}
			step(40 * time.Second)
			// Activity (a file call, then an exec) restarts the idle clock.
			e.doJSON("GET", "/v1/sandboxes/"+sb.ID+"/files/list?path=/", alice, nil, http.StatusOK, nil)
			step(40 * time.Second)
			if r := e.doExec(alice, sb.ID, node.ExecRequest{Args: []string{"echo"}}, ""); r.result == nil {
				t.Fatalf("exec: %+v", r)
			}
			step(40 * time.Second)
			if !e.node.Has(sb.ID) {
				t.Fatal("sandbox reaped although it was active")
			}
			step(25 * time.Second)
			switch onIdle {
			case "delete":
				if e.node.Has(sb.ID) {
					t.Fatal("idle sandbox still on the node")
				}
				if r := e.do("GET", "/v1/sandboxes/"+sb.ID, alice, nil); r.status != 404 {
					t.Fatalf("idle sandbox still listed: %d", r.status)
				}
			case "pause":
				var got node.Sandbox
				e.doJSON("GET", "/v1/sandboxes/"+sb.ID, alice, nil, http.StatusOK, &got)
				if got.State != node.StatePaused {
					t.Fatalf("state %s, want paused", got.State)
				}
				// Paused sandboxes are not reaped again; resuming is activity.
				step(time.Hour)
				e.doJSON("POST", "/v1/sandboxes/"+sb.ID+"/resume", alice, nil, http.StatusNoContent, nil)
				step(30 * time.Second)
				e.doJSON("GET", "/v1/sandboxes/"+sb.ID, alice, nil, http.StatusOK, &got)
				if got.State != node.StateRunning {
					t.Fatalf("resumed sandbox paused again at once: %s", got.State)
				}
			}
		})
	}
}

// A running exec keeps its sandbox alive past the idle TTL.
func TestIdleTTLSparesRunningExec(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	sb := e.create(alice, node.SandboxSpec{IdleTTL: time.Minute})
	info, err := e.svc.StartExec(context.Background(), Caller{Tenant: "alice"}, node.ExecRequest{SandboxID: sb.ID, Args: []string{"sleep"}}, noIO())
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(5 * time.Minute)
	if err := e.svc.ReapExpired(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !e.node.Has(sb.ID) {
		t.Fatal("sandbox with a running exec was reaped as idle")
	}
	if err := e.svc.SignalExec(context.Background(), Caller{Tenant: "alice"}, sb.ID, info.ExecID, 9); err != nil {
		t.Fatal(err)
	}
}

func TestMaxLifetimeAndSetTimeout(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	ctx := context.Background()
	short := e.create(alice, node.SandboxSpec{MaxLifetime: 10 * time.Minute})
	extended := e.create(alice, node.SandboxSpec{MaxLifetime: 10 * time.Minute})
	forever := e.create(alice, node.SandboxSpec{})
	e.clock.Advance(5 * time.Minute)
	e.doJSON("POST", "/v1/sandboxes/"+extended.ID+"/timeout", alice, `{"timeout_seconds":3600}`, http.StatusNoContent, nil)
	e.clock.Advance(5 * time.Minute)
	if err := e.svc.ReapExpired(ctx); err != nil {
		t.Fatal(err)
	}
	if e.node.Has(short.ID) || !e.node.Has(extended.ID) || !e.node.Has(forever.ID) {
		t.Fatalf("after 10m: short %v extended %v forever %v", e.node.Has(short.ID), e.node.Has(extended.ID), e.node.Has(forever.ID))
	}
	// The deadline survives a restart of the control plane.
	e.stop()
	e.start()
	e.clock.Advance(54 * time.Minute)
	if err := e.svc.ReapExpired(ctx); err != nil {
		t.Fatal(err)
	}
	if !e.node.Has(extended.ID) {
		t.Fatal("extended sandbox deleted before its new deadline")
	}
	e.clock.Advance(2 * time.Minute)
	if err := e.svc.ReapExpired(ctx); err != nil {
		t.Fatal(err)
	}
	if e.node.Has(extended.ID) || !e.node.Has(forever.ID) {
		t.Fatal("SetTimeout deadline not applied after restart")
	}
	// E2B semantics: SetTimeout can also shorten a lifetime.
	e.doJSON("POST", "/v1/sandboxes/"+forever.ID+"/timeout", alice, `{"timeout_seconds":1}`, http.StatusNoContent, nil)
	e.clock.Advance(time.Second)
	if err := e.svc.ReapExpired(ctx); err != nil {
		t.Fatal(err)
	}
	if e.node.Has(forever.ID) {
		t.Fatal("shortened timeout not applied")
	}
}

func TestLifetimeCap(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxLifetimeCap = time.Hour })
	alice := e.tenant("alice", Quota{})
	sb := e.create(alice, node.SandboxSpec{})
	if sb.Spec.MaxLifetime != time.Hour {
		t.Fatalf("uncapped lifetime: %v", sb.Spec.MaxLifetime)
	}
	if r := e.do("POST", "/v1/sandboxes/"+sb.ID+"/timeout", alice, `{"timeout_seconds":7200}`); r.status != 400 {
		t.Fatalf("timeout over the cap: %d %s", r.status, r.body)
	}
}

func TestRestartReconciles(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	ctx := context.Background()
	kept := e.create(alice, node.SandboxSpec{})
	lost := e.create(alice, node.SandboxSpec{})
	died := e.create(alice, node.SandboxSpec{})
	r := e.doExec(alice, lost.ID, node.ExecRequest{Args: []string{"exit", "7"}}, "")
	if r.result == nil {
		t.Fatal("exec failed")
	}
	waitFor(t, func() bool {
		var info node.ExecInfo
		return e.st.Get(ctx, store.BucketExecs, execKey(lost.ID, r.execID), &info) == nil
	})
	e.stop()
	e.node.Forget(lost.ID)
	e.node.Kill(died.ID, "init was OOM-killed")
	orphan, err := e.node.CreateSandbox(ctx, node.SandboxSpec{ID: "sb-orphan", Tenant: "alice", Image: "base:latest", CPU: 1})
	if err != nil {
		t.Fatal(err)
	}
	e.start()

	get := func(id string) node.Sandbox {
		var sb node.Sandbox
		e.doJSON("GET", "/v1/sandboxes/"+id, alice, nil, http.StatusOK, &sb)
		return sb
	}
	if sb := get(kept.ID); sb.State != node.StateRunning {
		t.Fatalf("kept: %+v", sb)
	}
	if sb := get(lost.ID); sb.State != node.StateDead || sb.Reason == "" {
		t.Fatalf("lost sandbox not marked dead with a reason: %+v", sb)
	}
	if sb := get(died.ID); sb.State != node.StateDead || sb.Reason != "init was OOM-killed" {
		t.Fatalf("died: %+v", sb)
	}
	if sb := get(orphan.ID); sb.State != node.StateRunning {
		t.Fatalf("orphan not adopted: %+v", sb)
	}
	// The dead sandbox's exec results are kept.
	var info node.ExecInfo
	e.doJSON("GET", "/v1/sandboxes/"+lost.ID+"/execs/"+r.execID, alice, nil, http.StatusOK, &info)
	if info.Result == nil || info.Result.ExitCode != 7 {
		t.Fatalf("exec result after restart: %+v", info)
	}
	var res struct {
		ExitCode int `json:"exit_code"`
	}
	e.doJSON("GET", "/v1/sandboxes/"+lost.ID+"/execs/"+r.execID+"/wait", alice, nil, http.StatusOK, &res)
	if res.ExitCode != 7 {
		t.Fatalf("wait after restart: %+v", res)
	}
	// Dead sandboxes take no exec and hold no quota, but can be deleted.
	if x := e.do("POST", "/v1/sandboxes/"+lost.ID+"/exec", alice, `{"args":["echo"]}`+"\n"); x.status != 409 {
		t.Fatalf("exec on dead: %d", x.status)
	}
	var list []node.Sandbox
	e.doJSON("GET", "/v1/sandboxes?state=dead", alice, nil, http.StatusOK, &list)
	if len(list) != 2 {
		t.Fatalf("dead sandboxes listed: %d", len(list))
	}
	e.doJSON("DELETE", "/v1/sandboxes/"+lost.ID, alice, nil, http.StatusNoContent, nil)
	e.doJSON("DELETE", "/v1/sandboxes/"+died.ID, alice, nil, http.StatusNoContent, nil)
	if e.node.Has(died.ID) {
		t.Fatal("dead sandbox not removed from its node")
	}
	var n int
	_ = e.st.List(ctx, store.BucketExecs, lost.ID+"/", func(string, []byte) error { n++; return nil })
	if n != 0 {
		t.Fatal("exec records outlive their deleted sandbox")
	}
}

// A sandbox whose processes die while the server runs shows as dead.
func TestGetNoticesDeath(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{Sandboxes: 1})
	sb := e.create(alice, node.SandboxSpec{})
	e.node.Kill(sb.ID, "killed")
	var got node.Sandbox
	e.doJSON("GET", "/v1/sandboxes/"+sb.ID, alice, nil, http.StatusOK, &got)
	if got.State != node.StateDead {
		t.Fatalf("state %s", got.State)
	}
	// A dead sandbox frees its quota.
	e.create(alice, node.SandboxSpec{})
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestForkAndSnapshot(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{Sandboxes: 4})
	bob := e.tenant("bob", Quota{})
	src := e.create(alice, node.SandboxSpec{Labels: map[string]string{"task": "t1"}})
	e.doJSON("PUT", "/v1/sandboxes/"+src.ID+"/files?path=/state.txt", alice, "step 41", http.StatusOK, nil)
	var forks []node.Sandbox
	e.doJSON("POST", "/v1/sandboxes/"+src.ID+"/fork", alice, `{"count":3}`, http.StatusOK, &forks)
	if len(forks) != 3 {
		t.Fatalf("forks: %d", len(forks))
	}
	for _, f := range forks {
		if f.Spec.FromSandbox != src.ID || f.Spec.Labels["task"] != "t1" || f.Spec.Tenant != "alice" {
			t.Fatalf("fork spec: %+v", f.Spec)
		}
		r := e.doJSON("GET", "/v1/sandboxes/"+f.ID+"/files?path=/state.txt", alice, nil, http.StatusOK, nil)
		if string(r.body) != "step 41" {
			t.Fatalf("fork file: %q", r.body)
		}
	}
	// Over quota: all or nothing.
	if r := e.do("POST", "/v1/sandboxes/"+src.ID+"/fork", alice, `{"count":2}`); r.status != 429 {
		t.Fatalf("fork over quota: %d %s", r.status, r.body)
	}
	if e.node.Len() != 4 || e.records() != 4 {
		t.Fatalf("fork rollback left state: node %d store %d", e.node.Len(), e.records())
	}

	var info ImageInfo
	e.doJSON("POST", "/v1/sandboxes/"+src.ID+"/snapshot", alice, `{"image":"alice/ckpt:41"}`, http.StatusOK, &info)
	if info.Name != "alice/ckpt:41" || info.Owner != "alice" || info.Public {
		t.Fatalf("snapshot info: %+v", info)
	}
	e.images.add("alice/ckpt:41", 1, func(ImportProgress) {}) // the node committed it into the image store
	if got, ok := e.node.SnapshotSource("alice/ckpt:41"); !ok || got != src.ID {
		t.Fatal("node snapshot not called")
	}
	e.doJSON("GET", "/v1/images/alice%2Fckpt:41", alice, nil, http.StatusOK, &info)
	if r := e.do("GET", "/v1/images/alice%2Fckpt:41", bob, nil); r.status != 404 {
		t.Fatalf("bob sees alice's image: %d", r.status)
	}
	if r := e.do("POST", "/v1/sandboxes", bob, `{"image":"alice/ckpt:41"}`); r.status != 404 {
		t.Fatalf("bob creates from alice's image: %d %s", r.status, r.body)
	}
	var ims []ImageInfo
	e.doJSON("GET", "/v1/images", bob, nil, http.StatusOK, &ims)
	if len(ims) != 1 || ims[0].Name != "base:latest" {
		t.Fatalf("bob's image list: %+v", ims)
	}
	// The name is alice's now: bob cannot snapshot into it.
	bsb := e.create(bob, node.SandboxSpec{})
	if r := e.do("POST", "/v1/sandboxes/"+bsb.ID+"/snapshot", bob, `{"image":"alice/ckpt:42"}`); r.status != 409 {
		t.Fatalf("snapshot into a taken name: %d %s", r.status, r.body)
	}
	if r := e.do("DELETE", "/v1/images/base", bob, nil); r.status != 403 {
		t.Fatalf("tenant removing a public image: %d", r.status)
	}
	e.doJSON("DELETE", "/v1/images/alice%2Fckpt:41", alice, nil, http.StatusNoContent, nil)
}

func TestImageImportStream(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	r := e.doJSON("POST", "/v1/images/import?ref=mine:v1", alice, strings.Repeat("t", 200<<10), http.StatusOK, nil)
	lines := strings.Split(strings.TrimSpace(string(r.body)), "\n")
	var last ImportFrame
	if err := jsonUnmarshal([]byte(lines[len(lines)-1]), &last); err != nil || last.Image == nil {
		t.Fatalf("last frame %q: %v", lines[len(lines)-1], err)
	}
	if last.Image.Owner != "alice" || last.Image.Size != 200<<10 {
		t.Fatalf("imported: %+v", last.Image)
	}
	var first ImportFrame
	if err := jsonUnmarshal([]byte(lines[0]), &first); err != nil || first.ImportProgress == nil {
		t.Fatalf("first frame %q is not progress", lines[0])
	}
	if x := e.do("POST", "/v1/images/import?ref=x:1&path=/srv/img.tar", alice, nil); x.status != 403 {
		t.Fatalf("tenant import from server path: %d", x.status)
	}
	if x := e.do("POST", "/v1/images/import?ref=x:1&public=true", alice, "tar"); x.status != 403 {
		t.Fatalf("tenant public import: %d", x.status)
	}
	if x := e.do("POST", "/v1/images/import?ref=empty:1", alice, ""); x.status != 400 {
		t.Fatalf("empty tar: %d %s", x.status, x.body)
	}
	e.doJSON("POST", "/v1/images/import?ref=pub:1&path=/srv/img.tar&public=true", e.admin, nil, http.StatusOK, nil)
	var info ImageInfo
	e.doJSON("GET", "/v1/images/pub:1", alice, nil, http.StatusOK, &info)
	if !info.Public || info.Owner != AdminTenant {
		t.Fatalf("public image: %+v", info)
	}
	if x := e.do("POST", "/v1/images/gc", alice, nil); x.status != 403 {
		t.Fatalf("tenant gc: %d", x.status)
	}
	e.doJSON("POST", "/v1/images/gc", e.admin, nil, http.StatusOK, nil)
	e.doJSON("GET", "/v1/images/mine:v1/stats", alice, nil, http.StatusOK, nil)
}

func TestAuditLog(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.AuditMaxBytes = 4096; c.AuditKeep = 2 })
	alice := e.tenant("alice", Quota{})
	sb := e.create(alice, node.SandboxSpec{})
	e.do("GET", "/v1/sandboxes/sb-nope", alice, nil)
	e.do("GET", "/v1/sandboxes", "dsec_"+strings.Repeat("0", 64), nil)
	entries := readAudit(t, e.cfg.DataDir+"/"+AuditFile)
	find := func(method, code string) *AuditEntry {
		for i := range entries {
			if entries[i].Method == method && entries[i].Code == code {
				return &entries[i]
			}
		}
		return nil
	}
	if a := find("CreateSandbox", "ok"); a == nil || a.Tenant != "alice" || a.SandboxID != sb.ID || a.TokenID == "" {
		t.Fatalf("create not audited: %+v", a)
	}
	if a := find("GetSandbox", CodeNotFound); a == nil || a.SandboxID != "sb-nope" {
		t.Fatalf("failed get not audited: %+v", entries)
	}
	if find("Authenticate", CodeUnauthenticated) == nil {
		t.Fatal("failed authentication not audited")
	}
	for i := 0; i < 100; i++ {
		e.do("GET", "/v1/sandboxes/"+sb.ID, alice, nil)
	}
	for _, name := range []string{AuditFile, AuditFile + ".1", AuditFile + ".2"} {
		fi, err := osStat(e.cfg.DataDir + "/" + name)
		if err != nil {
			t.Fatalf("rotated file %s: %v", name, err)
		}
		if fi > 4096 {
			t.Fatalf("%s is %d bytes, over the rotation size", name, fi)
		}
	}
	if _, err := osStat(e.cfg.DataDir + "/" + AuditFile + ".3"); err == nil {
		t.Fatal("more rotated files kept than asked")
	}
}

func TestServiceErrorsAreClassified(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	alice := Caller{Tenant: "alice"}
	e.tenant("alice", Quota{})
	_, err := e.svc.CreateSandbox(ctx, alice, node.SandboxSpec{Image: "base", Tenant: "bob"})
	if !errdefs.IsPermissionDenied(err) {
		t.Fatalf("create for another tenant: %v", err)
	}
	_, err = e.svc.GetSandbox(ctx, alice, "")
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("empty id: %v", err)
	}
	svc, err := NewService(Config{}, e.st, StaticNodes{}, nil, nil)
	if !errdefs.IsInvalidArgument(err) || svc != nil {
		t.Fatalf("config without data dir: %v", err)
	}
	if _, err := e.svc.CreateToken(ctx, alice, "ghost"); !errdefs.IsNotFound(err) {
		t.Fatalf("token for another tenant: %v", err)
	}
	if err := ErrorFromCode(CodeNotFound, "sandbox x: not found"); !errdefs.IsNotFound(err) || err.Error() != "sandbox x: not found" {
		t.Fatalf("ErrorFromCode: %v", err)
	}
	if !errors.Is(ErrorFromCode(CodeResourceExhausted, "q"), errdefs.ErrResourceExhausted) {
		t.Fatal("ErrorFromCode resource exhausted")
	}
}

// unreachable is a node whose agent cannot be reached for listing.
type unreachable struct{ *nodetest.Fake }

func (unreachable) ListSandboxes(context.Context) ([]node.Sandbox, error) {
	return nil, fmt.Errorf("connection refused: %w", errdefs.ErrUnavailable)
}

// A node that cannot be reached at restart leaves its sandboxes as they
// were: unknown is not dead.
func TestReconcileUnreachableNode(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	sb := e.create(alice, node.SandboxSpec{})
	e.stop()
	e.node.Forget(sb.ID)
	svc, err := NewService(e.cfg, e.st, StaticNodes{"node1": unreachable{e.node}}, e.images, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	list, err := svc.ListSandboxes(context.Background(), Caller{Tenant: "alice"}, ListFilter{})
	if err != nil || len(list) != 1 || list[0].State != node.StateRunning {
		t.Fatalf("after restart with an unreachable node: %+v %v", list, err)
	}
}

// A failed import does not keep the image name reserved.
func TestFailedImportReleasesName(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	bob := e.tenant("bob", Quota{})
	if r := e.do("POST", "/v1/images/import?ref=shared:v1", alice, ""); r.status != 400 {
		t.Fatalf("empty import: %d %s", r.status, r.body)
	}
	e.doJSON("POST", "/v1/images/import?ref=shared:v1", bob, "tar bytes", http.StatusOK, nil)
	var info ImageInfo
	e.doJSON("GET", "/v1/images/shared:v1", bob, nil, http.StatusOK, &info)
	if info.Owner != "bob" {
		t.Fatalf("owner %q", info.Owner)
	}
}

// Exec results reach the store in batches; a sandbox deleted before its
// batch is written gets no records back.
func TestExecResultsBatched(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	ctx := context.Background()
	kept := e.create(alice, node.SandboxSpec{})
	gone := e.create(alice, node.SandboxSpec{})
	var ids []string
	for i := 0; i < 5; i++ {
		r := e.doExec(alice, kept.ID, node.ExecRequest{Args: []string{"exit", "3"}}, "")
		if r.result == nil {
			t.Fatal("exec failed")
		}
		ids = append(ids, r.execID)
	}
	r := e.doExec(alice, gone.ID, node.ExecRequest{Args: []string{"exit", "4"}}, "")
	if r.result == nil {
		t.Fatal("exec failed")
	}
	e.doJSON("DELETE", "/v1/sandboxes/"+gone.ID, alice, nil, http.StatusNoContent, nil)
	waitFor(t, func() bool {
		n := 0
		_ = e.st.List(ctx, store.BucketExecs, kept.ID+"/", func(string, []byte) error { n++; return nil })
		return n == len(ids)
	})
	for _, id := range ids {
		var info node.ExecInfo
		if err := e.st.Get(ctx, store.BucketExecs, execKey(kept.ID, id), &info); err != nil || info.Result == nil || info.Result.ExitCode != 3 {
			t.Fatalf("stored result of %s: %+v %v", id, info, err)
		}
	}
	time.Sleep(2 * execFlushDelay)
	n := 0
	_ = e.st.List(ctx, store.BucketExecs, gone.ID+"/", func(string, []byte) error { n++; return nil })
	if n != 0 {
		t.Fatalf("%d exec records written for a deleted sandbox", n)
	}
}

// A sandbox keeps the results of its newest Config.ExecHistory ended execs:
// the store is pruned as results are committed, lists show that many and
// every running exec, and kept output is served per stream.
func TestExecHistoryPrunesRecords(t *testing.T) {
	const history = 4
	e := newEnv(t, func(c *Config) { c.ExecHistory = history })
	alice := e.tenant("alice", Quota{})
	ctx := context.Background()
	sb := e.create(alice, node.SandboxSpec{})
	running, err := e.svc.StartExec(ctx, Caller{Tenant: "alice"}, node.ExecRequest{SandboxID: sb.ID, Args: []string{"sleep"}}, noIO())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.svc.SignalExec(ctx, Caller{Tenant: "alice"}, sb.ID, running.ExecID, 9) }()
	var ids []string
	for i := range 12 {
		r := e.doExec(alice, sb.ID, node.ExecRequest{Args: []string{"echo", fmt.Sprint("run ", i)}}, "")
		if r.result == nil {
			t.Fatal("exec failed")
		}
		ids = append(ids, r.execID)
		time.Sleep(time.Millisecond) // distinct start times
	}
	stored := func() int {
		n := 0
		_ = e.st.List(ctx, store.BucketExecs, sb.ID+"/", func(string, []byte) error { n++; return nil })
		return n
	}
	waitFor(t, func() bool {
		_, pending := e.svc.pendingExec(sb.ID, ids[len(ids)-1])
		return !pending && stored() > 0
	})
	if n := stored(); n < history || n > history+1 {
		t.Fatalf("%d exec records stored, want %d to %d", n, history, history+1)
	}
	var newest node.ExecInfo
	if err := e.st.Get(ctx, store.BucketExecs, execKey(sb.ID, ids[len(ids)-1]), &newest); err != nil {
		t.Fatalf("newest result not stored: %v", err)
	}

	var listed []node.ExecInfo
	e.doJSON("GET", "/v1/sandboxes/"+sb.ID+"/execs", alice, nil, http.StatusOK, &listed)
	var ended, live []string
	for _, x := range listed {
		if x.Running {
			live = append(live, x.ExecID)
		} else {
			ended = append(ended, x.ExecID)
		}
	}
	if got, want := strings.Join(ended, ","), strings.Join(ids[len(ids)-history:], ","); got != want {
		t.Fatalf("listed ended execs %s, want the newest %d: %s", got, history, want)
	}
	if len(live) != 1 || live[0] != running.ExecID {
		t.Fatalf("running execs listed: %v, want the sleeping one", live)
	}

	for _, tc := range []struct {
		query  string
		status int
		body   string
	}{
		{"", http.StatusOK, "run 11\n"},
		{"?stream=stdout", http.StatusOK, "run 11\n"},
		{"?stream=stderr", http.StatusOK, ""},
		{"?stream=stdin", http.StatusBadRequest, ""},
	} {
		r := e.do("GET", "/v1/sandboxes/"+sb.ID+"/execs/"+ids[11]+"/output"+tc.query, alice, nil)
		if r.status != tc.status || (tc.status == http.StatusOK && string(r.body) != tc.body) {
			t.Fatalf("output%s: %d %q, want %d %q", tc.query, r.status, r.body, tc.status, tc.body)
		}
	}
	bob := e.tenant("bob", Quota{})
	if r := e.do("GET", "/v1/sandboxes/"+sb.ID+"/execs/"+ids[11]+"/output", bob, nil); r.status != http.StatusNotFound {
		t.Fatalf("another tenant read the output: %d %s", r.status, r.body)
	}

	e.doJSON("DELETE", "/v1/sandboxes/"+sb.ID, alice, nil, http.StatusNoContent, nil)
	if n := stored(); n != 0 {
		t.Fatalf("%d exec records left after delete", n)
	}
}
