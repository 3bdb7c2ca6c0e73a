package misconduct

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/api"
	"github.com/dsec-dev/dsec/internal/testutil"
)

// newTenant creates a tenant with a token and removes both when the test
// ends (after the sandboxes the test made, which go first).
func newTenant(t *testing.T, name string, q client.Quota) (secret, tokenID string) {
	t.Helper()
	c := admin(t)
	ctx := ctxT(t, 30*time.Second)
	if _, err := c.CreateTenant(ctx, client.Tenant{Name: name, Quota: q}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if sbs, err := c.ListSandboxes(ctx, nil, ""); err == nil {
			for _, sb := range sbs {
				if sb.Spec.Tenant == name {
					_ = c.DeleteSandbox(ctx, sb.ID)
				}
			}
		}
		if err := c.DeleteTenant(ctx, name); err != nil {
			t.Errorf("delete tenant %s: %v", name, err)
		}
	})
	tok, err := c.CreateToken(ctx, name, client.TokenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tok.Secret == "" {
		t.Fatal("token created without a secret")
	}
	return tok.Secret, tok.ID
}

// call is one raw API request over TCP; it returns the status.
func call(t *testing.T, token, method, path string, body []byte) int {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+suite.srv.TCPAddr+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode
}

// A tenant's sandboxes do not exist for another tenant: every route on
// them answers 404 (not 403, which would confirm they exist), nothing is
// changed, and the list does not show them. A revoked, missing or made-up
// token is 401 everywhere, and the unix socket is root's alone.
func TestTenantIsolation(t *testing.T) {
	testutil.RequiresRoot(t)
	alphaTok, _ := newTenant(t, "alpha", client.Quota{})
	betaTok, betaID := newTenant(t, "beta", client.Quota{})
	alpha := suite.srv.TCPClient(t, alphaTok)
	ctx := ctxT(t, 2*time.Minute)

	sb, err := alpha.CreateSandbox(ctx, client.SandboxSpec{Image: image, MemoryBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alpha.WriteFile(ctx, sb.ID, "/workspace/answer", 0o644, strings.NewReader("42")); err != nil {
		t.Fatal(err)
	}
	res, err := alpha.Exec(ctx, client.ExecRequest{SandboxID: sb.ID, Args: []string{"true"}}, nil, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	eid := res.ExecID

	p := "/v1/sandboxes/" + sb.ID
	routes := []struct {
		method, path string
		body         string
	}{
		{"GET", p, ""},
		{"POST", p + "/pause", ""},
		{"POST", p + "/resume", ""},
		{"POST", p + "/timeout", `{"timeout_seconds":1}`},
		{"GET", p + "/stats", ""},
		{"PUT", p + "/network", `{"allow":[{"cidr":"0.0.0.0/0"}]}`},
		{"POST", p + "/snapshot", `{"image":"stolen:1"}`},
		{"POST", p + "/fork", `{"count":1}`},
		{"POST", p + "/exec", `{"args":["cat","/workspace/answer"]}` + "\n"},
		{"GET", p + "/execs", ""},
		{"GET", p + "/execs/" + eid, ""},
		{"GET", p + "/execs/" + eid + "/wait", ""},
		{"POST", p + "/execs/" + eid + "/signal", `{"signal":9}`},
		{"GET", p + "/files?path=/workspace/answer", ""},
		{"PUT", p + "/files?path=/workspace/answer&mode=0644", "forged"},
		{"GET", p + "/files/stat?path=/workspace/answer", ""},
		{"GET", p + "/files/list?path=/workspace&depth=1", ""},
		{"POST", p + "/files/mkdir", `{"path":"/workspace/d","mode":493}`},
		{"POST", p + "/files/rename", `{"from":"/workspace/answer","to":"/workspace/moved"}`},
		{"DELETE", p + "/files?path=/workspace/answer&recursive=true", ""},
		{"DELETE", p, ""},
	}
	for _, r := range routes {
		if got := call(t, betaTok, r.method, r.path, []byte(r.body)); got != http.StatusNotFound {
			t.Errorf("beta %s %s: %d, want 404", r.method, r.path, got)
		}
	}
	// The same through the SDK, and the list.
	beta := suite.srv.TCPClient(t, betaTok)
	if _, err := beta.GetSandbox(ctx, sb.ID); !client.IsNotFound(err) {
		t.Errorf("beta GetSandbox: %v", err)
	}
	list, err := beta.ListSandboxes(ctx, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list {
		if s.ID == sb.ID || s.ID == suite.bystander {
			t.Errorf("beta lists %s", s.ID)
		}
	}
	// The admin's bystander is no more beta's than alpha's.
	if got := call(t, betaTok, "GET", "/v1/sandboxes/"+suite.bystander+"/files?path=/workspace/canary", nil); got != http.StatusNotFound {
		t.Errorf("beta reads the bystander's file: %d", got)
	}
	// Nothing changed for alpha.
	rc, _, err := alpha.ReadFile(ctx, sb.ID, "/workspace/answer")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if got, err := alpha.GetSandbox(ctx, sb.ID); err != nil || got.State != client.StateRunning || string(b) != "42" {
		t.Errorf("alpha's sandbox after beta's attempts: %v %+v %q", err, got, b)
	}

	// alpha's snapshot is alpha's image: beta can neither see nor use it.
	if _, err := alpha.Snapshot(ctx, sb.ID, "alpha-private:1"); err != nil {
		t.Fatalf("alpha snapshot: %v", err)
	}
	t.Cleanup(func() { _ = admin(t).RemoveImage(context.Background(), "alpha-private:1") })
	if _, err := beta.GetImage(ctx, "alpha-private:1"); !client.IsNotFound(err) {
		t.Errorf("beta GetImage of alpha's snapshot: %v, want not found", err)
	}
	if _, err := beta.CreateSandbox(ctx, client.SandboxSpec{Image: "alpha-private:1", MemoryBytes: 64 << 20}); !client.IsNotFound(err) {
		t.Errorf("beta creating from alpha's snapshot: %v, want not found", err)
	}
	if imgs, err := beta.ListImages(ctx); err != nil {
		t.Fatal(err)
	} else {
		for _, im := range imgs {
			if strings.HasPrefix(im.Name, "alpha-private") {
				t.Errorf("beta lists alpha's image %s", im.Name)
			}
		}
	}
	if _, err := beta.GetImage(ctx, image); err != nil {
		t.Errorf("beta cannot see the public image: %v", err)
	}

	// Tokens: revoked, absent, made up.
	if got := call(t, betaTok, "GET", "/v1/sandboxes", nil); got != http.StatusOK {
		t.Fatalf("beta's valid token: %d", got)
	}
	if err := admin(t).RevokeToken(ctx, betaID); err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{"revoked": betaTok, "none": "", "made up": "dsec_" + strings.Repeat("a", 40)} {
		for _, r := range []struct{ method, path string }{{"GET", "/v1/sandboxes"}, {"GET", p}, {"POST", "/v1/sandboxes"}, {"GET", "/v1/images"}, {"POST", "/v1/tenants"}} {
			if got := call(t, tok, r.method, r.path, []byte("{}")); got != http.StatusUnauthorized {
				t.Errorf("%s token: %s %s = %d, want 401", name, r.method, r.path, got)
			}
		}
	}
	// A tenant is not an admin.
	if got := call(t, alphaTok, "POST", "/v1/tenants", []byte(`{"name":"mallory","admin":true}`)); got != http.StatusForbidden && got != http.StatusNotFound {
		t.Errorf("alpha creating a tenant: %d", got)
	}

	// The unix socket: 0600 root, and a non-root user cannot connect.
	fi, err := os.Stat(suite.srv.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o600 || st.Uid != 0 {
		t.Errorf("socket mode %v owner %d", fi.Mode(), st.Uid)
	}
	if errs := connectAsNobody(t, suite.srv.Socket); errs[suite.srv.Socket] != "EACCES" {
		t.Errorf("uid 65534 connecting to the socket: %v, want EACCES", errs)
	}
	assertHealthy(t)
}

// connectAsNobody runs the attack tool's socket probe as uid 65534 on the
// host.
func connectAsNobody(t *testing.T, socket string) map[string]string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dsec-msc-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tool := filepath.Join(dir, "attack")
	b, err := os.ReadFile(suite.attack)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tool, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := osexec.Command(tool, "unix", socket)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("probe as nobody: %v", err)
	}
	var r struct {
		Connected map[string]string `json:"connected"`
		Errors    map[string]string `json:"errors"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Connected) > 0 {
		t.Errorf("nobody connected: %v", r.Connected)
	}
	return r.Errors
}

// Quotas: a request over any of them is refused with a clear error naming
// the resource, and leaves nothing behind (no sandbox record, no sandbox
// directory, the tenant's usage unchanged so a fitting request still
// succeeds).
func TestQuotaRefusals(t *testing.T) {
	testutil.RequiresRoot(t)
	tok, _ := newTenant(t, "quota", client.Quota{Sandboxes: 2, CPU: 2, MemoryBytes: 256 << 20, DiskBytes: 128 << 20})
	c := suite.srv.TCPClient(t, tok)
	ctx := ctxT(t, 2*time.Minute)
	spec := func(cpu float64, mem, disk int64) client.SandboxSpec {
		return client.SandboxSpec{Image: image, CPU: cpu, MemoryBytes: mem, DiskBytes: disk}
	}
	if _, err := c.CreateSandbox(ctx, spec(1, 128<<20, 64<<20)); err != nil {
		t.Fatal(err)
	}
	dirs := func() int {
		ents, _ := os.ReadDir(filepath.Join(suite.srv.DataDir, "node", "sandboxes"))
		return len(ents)
	}
	count := func() int {
		sbs, err := admin(t).ListSandboxes(ctx, nil, "")
		if err != nil {
			t.Fatal(err)
		}
		return len(sbs)
	}
	over := []struct {
		name string
		spec client.SandboxSpec
	}{
		{"memory", spec(0.5, 256<<20, 0)},
		{"cpu", spec(2, 64<<20, 0)},
		{"disk", spec(0.5, 64<<20, 128<<20)},
	}
	check := func(name string, s client.SandboxSpec) {
		t.Helper()
		beforeDirs, beforeCount := dirs(), count()
		_, err := c.CreateSandbox(ctx, s)
		if !client.IsResourceExhausted(err) || !strings.Contains(strings.ToLower(err.Error()), name) {
			t.Errorf("over the %s quota: %v, want resource exhausted naming %s", name, err, name)
		}
		if d, n := dirs(), count(); d != beforeDirs || n != beforeCount {
			t.Errorf("refused %s request left something: dirs %d -> %d, sandboxes %d -> %d", name, beforeDirs, d, beforeCount, n)
		}
	}
	for _, o := range over {
		check(o.name, o.spec)
	}
	// The usage did not grow with the refusals: a request that fits works.
	if _, err := c.CreateSandbox(ctx, spec(1, 64<<20, 32<<20)); err != nil {
		t.Fatalf("a fitting request after refusals: %v", err)
	}
	check("sandboxes", spec(0, 16<<20, 0))

	// The CLI says it in one line.
	_, errOut, code, err := suite.srv.Run([]string{"DSEC_ADDR=tcp://" + suite.srv.TCPAddr, "DSEC_TOKEN=" + tok},
		"sandbox", "create", "--image", image, "--memory", "16Mi")
	if err != nil {
		t.Fatal(err)
	}
	if code == 0 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, "quota") {
		t.Errorf("CLI over quota: exit %d, %q", code, errOut)
	}
}

// The audit log records who did what to which sandbox, refusals included;
// it lives in the server's data dir (mode 0600), where no sandbox can read
// it (TestGraderArtifactsInvisible searches for it from inside).
func TestAuditLog(t *testing.T) {
	testutil.RequiresRoot(t)
	tok, _ := newTenant(t, "audited", client.Quota{})
	otherTok, _ := newTenant(t, "prying", client.Quota{})
	c := suite.srv.TCPClient(t, tok)
	ctx := ctxT(t, time.Minute)
	sb, err := c.CreateSandbox(ctx, client.SandboxSpec{Image: image, MemoryBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, client.ExecRequest{SandboxID: sb.ID, Args: []string{"true"}}, nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	if got := call(t, otherTok, "GET", "/v1/sandboxes/"+sb.ID+"/files?path=/etc/passwd", nil); got != http.StatusNotFound {
		t.Fatalf("prying read: %d", got)
	}

	path := filepath.Join(suite.srv.DataDir, api.AuditFile)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("audit log mode %v", fi.Mode())
	}
	var entries []api.AuditEntry
	deadline := time.Now().Add(10 * time.Second)
	for {
		entries = readAudit(t, path)
		if hasEntry(entries, "audited", sb.ID, "ok") && hasEntry(entries, "prying", sb.ID, "not_found") {
			break
		}
		if time.Now().After(deadline) {
			var mine []string
			for _, e := range entries {
				if e.SandboxID == sb.ID {
					mine = append(mine, fmt.Sprintf("%+v", e))
				}
			}
			t.Fatalf("audit log lacks the calls on %s; it has:\n%s", sb.ID, strings.Join(mine, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	methods := map[string]bool{}
	for _, e := range entries {
		if e.Tenant == "audited" && e.SandboxID == sb.ID {
			methods[e.Method] = true
		}
	}
	if len(methods) < 2 {
		t.Errorf("audited calls on %s: %v, want the create and the exec", sb.ID, methods)
	}
}

func readAudit(t *testing.T, path string) []api.AuditEntry {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []api.AuditEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e api.AuditEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("audit line %q: %v", sc.Text(), err)
		}
		out = append(out, e)
	}
	return out
}

func hasEntry(es []api.AuditEntry, tenant, sandbox, code string) bool {
	for _, e := range es {
		if e.Tenant == tenant && e.SandboxID == sandbox && e.Code == code {
			return true
		}
	}
	return false
}
