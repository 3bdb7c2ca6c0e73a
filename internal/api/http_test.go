package api

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/internal/node"
)

func TestAuthRequiredOnTCP(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		name   string
		header string
	}{
		{"no header", ""},
		{"not bearer", "Basic dXNlcjpwYXNz"},
		{"empty bearer", "Bearer "},
		{"malformed token", "Bearer hello"},
		{"short token", "Bearer dsec_abcd"},
		{"unknown token", "Bearer dsec_" + strings.Repeat("ab", 32)},
		{"unknown e2b key", "Bearer e2b_" + strings.Repeat("cd", 32)},
		{"non-hex token", "Bearer dsec_" + strings.Repeat("zz", 32)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", e.srv.URL+"/v1/sandboxes", nil)
			if c.header != "" {
				req.Header.Set("Authorization", c.header)
			}
			resp, err := e.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("status %d, want 401", resp.StatusCode)
			}
		})
	}
	if r := e.do("GET", "/v1/sandboxes", "", nil); r.errBody(t).Code != CodeUnauthenticated {
		t.Fatalf("code: %s", r.body)
	}
	e.doJSON("GET", "/v1/sandboxes", e.admin, nil, http.StatusOK, nil)
	e.doJSON("GET", "/healthz", "", nil, http.StatusOK, nil)
	// Unknown routes are a JSON 404 too.
	if r := e.do("GET", "/v2/nothing", e.admin, nil); r.status != 404 || r.errBody(t).Code != CodeNotFound {
		t.Fatalf("unknown route: %d %s", r.status, r.body)
	}
}

func TestTokenRevokeAndE2BKeys(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	bob := e.tenant("bob", Quota{})
	var tok Token
	e.doJSON("POST", "/v1/tokens", alice, TokenRequest{Tenant: "alice", Prefix: "e2b_"}, http.StatusCreated, &tok)
	if !strings.HasPrefix(tok.Secret, "e2b_") || len(tok.Secret) != 4+64 {
		t.Fatalf("e2b key shape: %q", tok.Secret)
	}
	e.doJSON("GET", "/v1/sandboxes", tok.Secret, nil, http.StatusOK, nil)
	// The secret is never stored: only its hash.
	raw := dumpBucket(t, e, "tokens") + dumpBucket(t, e, "token-hashes")
	if strings.Contains(raw, tok.Secret[4:]) {
		t.Fatal("the store holds the token secret")
	}
	// A tenant cannot mint tokens for another one, nor see its tokens.
	if r := e.do("POST", "/v1/tokens", alice, TokenRequest{Tenant: "bob"}); r.status != 404 {
		t.Fatalf("cross-tenant token: %d %s", r.status, r.body)
	}
	if r := e.do("DELETE", "/v1/tokens/"+tok.ID, bob, nil); r.status != 404 {
		t.Fatalf("cross-tenant revoke: %d %s", r.status, r.body)
	}
	if r := e.do("POST", "/v1/tokens", alice, TokenRequest{Prefix: "xyz_"}); r.status != 400 {
		t.Fatalf("bad prefix: %d %s", r.status, r.body)
	}
	e.doJSON("DELETE", "/v1/tokens/"+tok.ID, alice, nil, http.StatusNoContent, nil)
	if r := e.do("GET", "/v1/sandboxes", tok.Secret, nil); r.status != 401 {
		t.Fatalf("revoked token: %d %s", r.status, r.body)
	}
	e.doJSON("GET", "/v1/sandboxes", alice, nil, http.StatusOK, nil)
	// Deleting a tenant invalidates its tokens.
	e.doJSON("DELETE", "/v1/tenants/bob", e.admin, nil, http.StatusNoContent, nil)
	if r := e.do("GET", "/v1/sandboxes", bob, nil); r.status != 401 {
		t.Fatalf("token of a deleted tenant: %d %s", r.status, r.body)
	}
}

func dumpBucket(t *testing.T, e *env, bucket string) string {
	var sb strings.Builder
	_ = e.st.List(context.Background(), bucket, "", func(k string, v []byte) error {
		sb.WriteString(k)
		sb.Write(v)
		return nil
	})
	return sb.String()
}

func TestTenantAdminOnly(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	if r := e.do("POST", "/v1/tenants", alice, Tenant{Name: "mallory"}); r.status != 403 {
		t.Fatalf("tenant creating tenants: %d %s", r.status, r.body)
	}
	if r := e.do("GET", "/v1/tenants", alice, nil); r.status != 403 {
		t.Fatalf("tenant listing tenants: %d", r.status)
	}
	var ts []Tenant
	e.doJSON("GET", "/v1/tenants", e.admin, nil, http.StatusOK, &ts)
	if len(ts) != 2 {
		t.Fatalf("tenants: %+v", ts)
	}
	if r := e.do("POST", "/v1/tenants", e.admin, Tenant{Name: "alice"}); r.status != 409 {
		t.Fatalf("duplicate tenant: %d", r.status)
	}
	if r := e.do("POST", "/v1/tenants", e.admin, Tenant{Name: "Bad Name"}); r.status != 400 {
		t.Fatalf("bad tenant name: %d", r.status)
	}
	if r := e.do("POST", "/v1/tenants", e.admin, Tenant{Name: "neg", Quota: Quota{CPU: -1}}); r.status != 400 {
		t.Fatalf("negative quota: %d", r.status)
	}
	sb := e.create(alice, node.SandboxSpec{})
	if r := e.do("DELETE", "/v1/tenants/alice", e.admin, nil); r.status != 409 {
		t.Fatalf("deleting a tenant with sandboxes: %d %s", r.status, r.body)
	}
	e.doJSON("DELETE", "/v1/sandboxes/"+sb.ID, alice, nil, http.StatusNoContent, nil)
	e.doJSON("DELETE", "/v1/tenants/alice", e.admin, nil, http.StatusNoContent, nil)
	if r := e.do("DELETE", "/v1/tenants/admin", e.admin, nil); r.status != 409 {
		t.Fatalf("deleting admin: %d", r.status)
	}
}

// Every sandbox route answers 404 for another tenant's sandbox, exactly as
// for a missing one, and changes nothing.
func TestCrossTenantIsNotFound(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	bob := e.tenant("bob", Quota{})
	sb := e.create(alice, node.SandboxSpec{})
	var info node.ExecInfo
	execID := ""
	{
		r := e.doExec(alice, sb.ID, node.ExecRequest{Args: []string{"echo", "hi"}}, "")
		info.ExecID = r.execID
		execID = r.execID
	}
	e.doJSON("PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/f", alice, "data", http.StatusOK, nil)
	p := "/v1/sandboxes/" + sb.ID
	routes := []struct {
		method, path string
		body         any
	}{
		{"GET", p, nil},
		{"DELETE", p, nil},
		{"POST", p + "/pause", nil},
		{"POST", p + "/resume", nil},
		{"POST", p + "/timeout", `{"timeout_seconds":60}`},
		{"GET", p + "/stats", nil},
		{"PUT", p + "/network", `{}`},
		{"POST", p + "/snapshot", `{"image":"steal:v1"}`},
		{"POST", p + "/fork", `{"count":1}`},
		{"POST", p + "/exec", `{"args":["echo","x"]}` + "\n"},
		{"GET", p + "/execs", nil},
		{"GET", p + "/execs/" + execID, nil},
		{"GET", p + "/execs/" + execID + "/wait", nil},
		{"POST", p + "/execs/" + execID + "/signal", `{"signal":9}`},
		{"GET", p + "/files?path=/f", nil},
		{"PUT", p + "/files?path=/g", "x"},
		{"DELETE", p + "/files?path=/f", nil},
		{"GET", p + "/files/stat?path=/f", nil},
		{"GET", p + "/files/list?path=/", nil},
		{"POST", p + "/files/mkdir", `{"path":"/d"}`},
		{"POST", p + "/files/rename", `{"from":"/f","to":"/h"}`},
	}
	for _, rt := range routes {
		t.Run(rt.method+" "+strings.TrimPrefix(rt.path, p), func(t *testing.T) {
			r := e.do(rt.method, rt.path, bob, rt.body)
			if r.status != http.StatusNotFound {
				t.Fatalf("status %d, want 404: %s", r.status, r.body)
			}
			eb := r.errBody(t)
			// Same answer as for a sandbox that does not exist.
			missing := e.do(rt.method, strings.Replace(rt.path, sb.ID, "sb-doesnotexist", 1), bob, rt.body)
			if missing.status != 404 || strings.ReplaceAll(missing.errBody(t).Error, "sb-doesnotexist", sb.ID) != eb.Error {
				t.Fatalf("another tenant's sandbox is distinguishable from a missing one: %q vs %q", eb.Error, missing.body)
			}
		})
	}
	// Nothing changed for alice.
	var got node.Sandbox
	e.doJSON("GET", p, alice, nil, http.StatusOK, &got)
	if got.State != node.StateRunning {
		t.Fatalf("state after bob's calls: %s", got.State)
	}
	e.doJSON("GET", p+"/files/stat?path=/f", alice, nil, http.StatusOK, nil)
	var list []node.Sandbox
	e.doJSON("GET", "/v1/sandboxes", bob, nil, http.StatusOK, &list)
	if len(list) != 0 {
		t.Fatalf("bob lists alice's sandboxes: %+v", list)
	}
	e.doJSON("GET", "/v1/sandboxes", e.admin, nil, http.StatusOK, &list)
	if len(list) != 1 {
		t.Fatalf("admin sees %d sandboxes", len(list))
	}
}

func TestBadInputIsClear400(t *testing.T) {
	e := newEnv(t, func(c *Config) {})
	alice := e.tenant("alice", Quota{})
	sb := e.create(alice, node.SandboxSpec{})
	p := "/v1/sandboxes/" + sb.ID
	huge := `{"image":"base","env":["A=` + strings.Repeat("x", 2<<20) + `"]}`
	cases := []struct {
		name, method, path string
		body               any
		want               string // part of the message
	}{
		{"malformed JSON", "POST", "/v1/sandboxes", `{"image":`, "malformed JSON"},
		{"syntax error", "POST", "/v1/sandboxes", `{"image" "base"}`, "malformed JSON"},
		{"empty body", "POST", "/v1/sandboxes", ``, "empty"},
		{"unknown field", "POST", "/v1/sandboxes", `{"image":"base","memory":5}`, "unknown field"},
		{"wrong type", "POST", "/v1/sandboxes", `{"image":"base","cpu":"two"}`, "cpu"},
		{"trailing data", "POST", "/v1/sandboxes", `{"image":"base"}{"x":1}`, "after the JSON"},
		{"huge body", "POST", "/v1/sandboxes", huge, "larger than"},
		{"negative memory", "POST", "/v1/sandboxes", `{"image":"base","memory_bytes":-1}`, "memory_bytes"},
		{"bad id", "POST", "/v1/sandboxes", `{"id":"Bad/Id","image":"base"}`, "sandbox id"},
		{"no image", "POST", "/v1/sandboxes", `{}`, "image is required"},
		{"bad image ref", "POST", "/v1/sandboxes", `{"image":"UPPER:x"}`, "image reference"},
		{"bad on_idle", "POST", "/v1/sandboxes", `{"image":"base","on_idle":"explode"}`, "on_idle"},
		{"bad cidr", "POST", "/v1/sandboxes", `{"image":"base","network":{"allow":[{"cidr":"nope"}]}}`, "CIDR"},
		{"bad state filter", "GET", "/v1/sandboxes?state=zombie", nil, "state"},
		{"bad label filter", "GET", "/v1/sandboxes?label=novalue", nil, "key=value"},
		{"bad path id", "GET", "/v1/sandboxes/BAD!ID", nil, "sandbox id"},
		{"timeout missing", "POST", p + "/timeout", `{}`, "timeout_seconds is required"},
		{"timeout negative", "POST", p + "/timeout", `{"timeout_seconds":-5}`, "positive"},
		{"fork zero", "POST", p + "/fork", `{"count":0}`, "fork count"},
		{"fork too many", "POST", p + "/fork", `{"count":100000}`, "fork count"},
		{"signal zero", "POST", p + "/execs/e-1/signal", `{"signal":0}`, "signal"},
		{"snapshot no image", "POST", p + "/snapshot", `{}`, "image is required"},
		{"file path missing", "GET", p + "/files", nil, "path is required"},
		{"file path relative", "GET", p + "/files?path=etc/passwd", nil, "absolute"},
		{"upload bad mode", "PUT", p + "/files?path=/x&mode=999", "x", "mode"},
		{"list bad depth", "GET", p + "/files/list?path=/&depth=-1", nil, "depth"},
		{"list deep", "GET", p + "/files/list?path=/&depth=1000", nil, "depth"},
		{"remove bad bool", "DELETE", p + "/files?path=/x&recursive=maybe", nil, "recursive"},
		{"remove root", "DELETE", p + "/files?path=/&recursive=true", nil, "refusing"},
		{"mkdir no path", "POST", p + "/files/mkdir", `{"mode":493}`, "path is required"},
		{"mkdir bad mode", "POST", p + "/files/mkdir", `{"path":"/d","mode":99999}`, "mode"},
		{"rename relative", "POST", p + "/files/rename", `{"from":"/a","to":"b"}`, "absolute"},
		{"exec empty", "POST", p + "/exec", ``, "empty"},
		{"exec no command", "POST", p + "/exec", "{}\n", "args or shell"},
		{"exec bad json", "POST", p + "/exec", "{nope\n", "malformed JSON"},
		{"exec other sandbox", "POST", p + "/exec", `{"sandbox_id":"sb-x","args":["echo"]}` + "\n", "differs"},
		{"exec negative timeout", "POST", p + "/exec", `{"args":["echo"],"timeout":-1}` + "\n", "negative"},
		{"import no ref", "POST", "/v1/images/import", "tar", "ref is required"},
		{"capacity negative", "POST", "/v1/capacity", `{"cpu":-1}`, "cpu"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.do(c.method, c.path, alice, c.body)
			if r.status != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", r.status, r.body)
			}
			eb := r.errBody(t)
			if eb.Code != CodeInvalidArgument || !strings.Contains(eb.Error, c.want) {
				t.Fatalf("error %+v, want code invalid_argument and %q in the message", eb, c.want)
			}
		})
	}
	// Nothing was created or lost by the refused calls.
	if n := e.node.Len(); n != 1 {
		t.Fatalf("node holds %d sandboxes, want 1", n)
	}
	if n := e.records(); n != 1 {
		t.Fatalf("store holds %d sandboxes, want 1", n)
	}
}

func TestSandboxLifecycleOverHTTP(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	sb := e.create(alice, node.SandboxSpec{Labels: map[string]string{"run": "7", "kind": "rl"}})
	if sb.State != node.StateRunning || sb.Spec.Tenant != "alice" || sb.Spec.CPU != 1 || sb.Spec.MemoryBytes != 512<<20 {
		t.Fatalf("created: %+v", sb)
	}
	e.create(alice, node.SandboxSpec{Labels: map[string]string{"run": "8"}})
	var list []node.Sandbox
	e.doJSON("GET", "/v1/sandboxes?label=run=7&label=kind=rl&state=running", alice, nil, http.StatusOK, &list)
	if len(list) != 1 || list[0].ID != sb.ID {
		t.Fatalf("label filter: %+v", list)
	}
	p := "/v1/sandboxes/" + sb.ID
	e.doJSON("POST", p+"/pause", alice, nil, http.StatusNoContent, nil)
	if r := e.do("POST", p+"/pause", alice, nil); r.status != 409 {
		t.Fatalf("pause paused: %d", r.status)
	}
	if r := e.do("POST", p+"/exec", alice, `{"args":["echo"]}`+"\n"); r.status != 409 || !strings.Contains(r.errBody(t).Error, "paused") {
		t.Fatalf("exec on paused: %d %s", r.status, r.body)
	}
	e.doJSON("GET", "/v1/sandboxes?state=paused", alice, nil, http.StatusOK, &list)
	if len(list) != 1 {
		t.Fatalf("state filter: %+v", list)
	}
	e.doJSON("POST", p+"/resume", alice, nil, http.StatusNoContent, nil)
	var st node.SandboxStats
	e.doJSON("GET", p+"/stats", alice, nil, http.StatusOK, &st)
	if st.CPURequested != 1 {
		t.Fatalf("stats: %+v", st)
	}
	e.doJSON("PUT", p+"/network", alice, node.NetworkPolicy{Allow: []node.NetworkRule{{CIDR: "10.0.0.0/8", Ports: "443"}}}, http.StatusNoContent, nil)
	if got := e.node.Network(sb.ID); len(got.Allow) != 1 || got.Allow[0].CIDR != "10.0.0.0/8" {
		t.Fatalf("network on node: %+v", got)
	}
	var nodes []node.NodeInfo
	e.doJSON("GET", "/v1/nodes", alice, nil, http.StatusOK, &nodes)
	if len(nodes) != 1 || nodes[0].Name != "node1" {
		t.Fatalf("nodes: %+v", nodes)
	}
	var capy node.Capacity
	e.doJSON("POST", "/v1/capacity", alice, node.SandboxSpec{CPU: 2, MemoryBytes: 1 << 30}, http.StatusOK, &capy)
	// 8 cores with 2 sandboxes of 1 core: 6 left, 3 of 2 cores.
	if capy.Fits != 3 || capy.LimitingResource != "cpu" {
		t.Fatalf("capacity: %+v", capy)
	}
	e.doJSON("DELETE", p, alice, nil, http.StatusNoContent, nil)
	if e.node.Has(sb.ID) {
		t.Fatal("deleted sandbox still on the node")
	}
	if r := e.do("GET", p, alice, nil); r.status != 404 {
		t.Fatalf("get deleted: %d", r.status)
	}
}

func TestMetricsExposed(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	e.create(alice, node.SandboxSpec{CPU: 2})
	e.do("POST", "/v1/sandboxes", alice, `{"image":"base","memory_bytes":1099511627776}`) // refused by the node
	if r := e.do("GET", "/metrics", alice, nil); r.status != 403 {
		t.Fatalf("tenant reading metrics: %d", r.status)
	}
	r := e.doJSON("GET", "/metrics", e.admin, nil, http.StatusOK, nil)
	body := string(r.body)
	for _, want := range []string{
		`dsec_sandboxes{state="running"} 1`,
		`dsec_sandbox_creations_total 1`,
		`dsec_sandbox_create_failures_total{code="resource_exhausted"} 1`,
		`dsec_tenant_cpu_requested_cores{tenant="alice"} 2`,
		`dsec_tenant_cpu_used_cores{tenant="alice"} 1`,
		`dsec_tenant_memory_limit_bytes{tenant="alice"} 5.36870912e+08`,
		`dsec_node_cpu_requested_cores{node="node1"} 2`,
		`dsec_node_cpus{node="node1"} 8`,
		`dsec_api_requests_total{code="201",route="POST /v1/sandboxes"} 1`,
		`dsec_api_requests_total{code="429",route="POST /v1/sandboxes"} 1`,
		`dsec_sandbox_create_seconds_count 1`,
		`dsec_exec_seconds_bucket`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}
