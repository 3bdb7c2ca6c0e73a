package api

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
)

func unixClient(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}
}

func TestServerUnixAdminAndTCPTokens(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "run", "dsec.sock")

	// A stale socket (no listener) is replaced.
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	tcp, err := Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	unix, err := Listen("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode: %v %v", fi.Mode(), err)
	}
	// A live socket is not taken over.
	if _, err := Listen("unix://" + sock); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second listen on a live socket: %v", err)
	}

	srv := NewServer(NewHandler(e.svc), nil, WithShutdownTimeout(2*time.Second))
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.ServeListeners(ctx, tcp, unix) }()

	uc := unixClient(sock)
	resp, err := uc.Get("http://dsec/v1/tenants")
	if err != nil {
		t.Fatal(err)
	}
	var ts []Tenant
	_ = json.NewDecoder(resp.Body).Decode(&ts)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(ts) != 1 || ts[0].Name != AdminTenant {
		t.Fatalf("unix socket without token: %d %+v", resp.StatusCode, ts)
	}
	// On the socket a token still selects its tenant.
	alice := e.tenant("alice", Quota{})
	req, _ := http.NewRequest("GET", "http://dsec/v1/tenants", nil)
	req.Header.Set("Authorization", "Bearer "+alice)
	if resp, err := uc.Do(req); err != nil || resp.StatusCode != 403 {
		t.Fatalf("tenant token on the socket: %v %v", resp.StatusCode, err)
	}

	tcpURL := "http://" + tcp.Addr().String()
	if resp, err := http.Get(tcpURL + "/v1/tenants"); err != nil || resp.StatusCode != 401 {
		t.Fatalf("tcp without token: %v %v", resp.StatusCode, err)
	}
	req, _ = http.NewRequest("GET", tcpURL+"/v1/sandboxes", nil)
	req.Header.Set("Authorization", "Bearer "+alice)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("tcp with token: %v %v", resp.StatusCode, err)
	}

	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("graceful shutdown hung")
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
}

func TestListenRefusesBadAddresses(t *testing.T) {
	dir := t.TempDir()
	regular := filepath.Join(dir, "file")
	if err := os.WriteFile(regular, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"", "http://x", "tcp://nohost", "unix://relative.sock", "unix://" + regular} {
		if _, err := Listen(addr); err == nil {
			t.Errorf("Listen(%q) succeeded", addr)
		}
	}
	if b, err := os.ReadFile(regular); err != nil || string(b) != "keep me" {
		t.Fatal("a regular file in the socket's place was touched")
	}
}

// A client that keeps stdin open after its process ended gets the result,
// a properly ended reply, and nothing it sends later is taken for a
// request.
func TestExecClientHoldsStdin(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	sb := e.create(alice, node.SandboxSpec{})
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() {
		_, _ = io.WriteString(pw, `{"args":["echo","done"]}`+"\n")
	}()
	req, _ := http.NewRequest("POST", e.srv.URL+"/v1/sandboxes/"+sb.ID+"/exec", pr)
	req.Header.Set("Authorization", "Bearer "+alice)
	start := time.Now()
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("reply not ended cleanly: %v (%q)", err, body)
	}
	if !strings.Contains(string(body), `"result"`) || !strings.Contains(string(body), `"stream":"stdout"`) {
		t.Fatalf("reply: %s", body)
	}
	if d := time.Since(start); d > stdinGrace+5*time.Second {
		t.Fatalf("reply took %v", d)
	}
	// Anything written now goes nowhere; the server keeps serving.
	go func() { _, _ = io.WriteString(pw, "GET /v1/tenants HTTP/1.1\r\nHost: x\r\n\r\n") }()
	e.doJSON("GET", "/v1/sandboxes/"+sb.ID, alice, nil, http.StatusOK, nil)
}

// A process that ignores its stdin does not keep its exec call open, and
// the connection stays usable.
func TestExecIgnoredStdin(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	sb := e.create(alice, node.SandboxSpec{})
	r := e.doExec(alice, sb.ID, node.ExecRequest{Args: []string{"exit", "0"}}, strings.Repeat("junk\n", 100000))
	if r.result == nil || r.result.ExitCode != 0 {
		t.Fatalf("exec: %+v", r)
	}
	for i := 0; i < 3; i++ {
		e.doJSON("GET", "/v1/sandboxes/"+sb.ID, alice, nil, http.StatusOK, nil)
	}
}
