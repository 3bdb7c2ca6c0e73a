package client_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/client/clienttest"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

func newClient(t *testing.T) (*client.Client, *clienttest.Server) {
	t.Helper()
	srv := clienttest.NewServer(t, clienttest.ServerOptions{Unix: true, Images: []string{"base"}})
	c, err := client.New(srv.Addr, client.WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	return c, srv
}

func TestNewAddresses(t *testing.T) {
	for _, tc := range []struct {
		addr    string
		local   bool
		wantErr bool
	}{
		{"unix:///run/dsec/dsec.sock", true, false},
		{"tcp://127.0.0.1:7070", false, false},
		{"http://localhost:7070", false, false},
		{"https://dsec.example:443", false, false},
		{"ftp://x", false, true},
		{"127.0.0.1:7070", false, true},
		{"unix://", false, true},
		{"tcp://", false, true},
	} {
		c, err := client.New(tc.addr)
		if (err != nil) != tc.wantErr {
			t.Errorf("New(%q) error = %v, want error %v", tc.addr, err, tc.wantErr)
			continue
		}
		if err == nil && c.Local() != tc.local {
			t.Errorf("New(%q).Local() = %v", tc.addr, c.Local())
		}
	}
}

func TestNewFromEnv(t *testing.T) {
	t.Setenv("DSEC_ADDR", "tcp://10.1.2.3:99")
	t.Setenv("DSEC_TOKEN", "tok")
	c, err := client.New("")
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr() != "http://10.1.2.3:99" || c.Local() {
		t.Fatalf("addr from env = %s", c.Addr())
	}
}

func TestSandboxLifecycle(t *testing.T) {
	c, _ := newClient(t)
	ctx := t.Context()
	sb, err := c.CreateSandbox(ctx, client.SandboxSpec{Image: "base", CPU: 1, MemoryBytes: 256 << 20, Labels: map[string]string{"run": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID == "" || sb.State != client.StateRunning {
		t.Fatalf("created %+v", sb)
	}
	if _, err := c.CreateSandbox(ctx, client.SandboxSpec{Image: "base", Labels: map[string]string{"run": "b"}}); err != nil {
		t.Fatal(err)
	}
	got, err := c.GetSandbox(ctx, sb.ID)
	if err != nil || got.ID != sb.ID || got.Spec.MemoryBytes != 256<<20 {
		t.Fatalf("get = %+v, %v", got, err)
	}
	list, err := c.ListSandboxes(ctx, map[string]string{"run": "a"}, "")
	if err != nil || len(list) != 1 || list[0].ID != sb.ID {
		t.Fatalf("list by label = %v, %v", list, err)
	}
	if err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	paused, err := c.ListSandboxes(ctx, nil, client.StatePaused)
	if err != nil || len(paused) != 1 {
		t.Fatalf("list paused = %v, %v", paused, err)
	}
	// Pausing twice is a failed precondition, reported as such.
	if err := c.Pause(ctx, sb.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) || client.StatusCode(err) != 409 {
		t.Fatalf("second pause: %v", err)
	}
	if err := c.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.SetTimeout(ctx, sb.ID, 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	st, err := c.Stats(ctx, sb.ID)
	if err != nil || st.CPURequested != 1 || st.MemoryLimitBytes != 256<<20 {
		t.Fatalf("stats = %+v, %v", st, err)
	}
	pol := client.NetworkPolicy{Allow: []client.NetworkRule{{Preset: "pypi"}, {CIDR: "10.0.0.0/8", Ports: "443", Protocol: "tcp"}}}
	if err := c.SetNetwork(ctx, sb.ID, pol); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.GetSandbox(ctx, sb.ID); len(got.Spec.Network.Allow) != 2 || got.Spec.Network.Allow[1].Ports != "443" {
		t.Fatalf("network not applied: %+v", got.Spec.Network)
	}
	img, err := c.Snapshot(ctx, sb.ID, "snap:v1")
	if err != nil || img.Name != "snap:v1" {
		t.Fatalf("snapshot = %+v, %v", img, err)
	}
	forks, err := c.Fork(ctx, sb.ID, 2)
	if err != nil || len(forks) != 2 {
		t.Fatalf("fork = %v, %v", forks, err)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, err = c.GetSandbox(ctx, sb.ID)
	if !errors.Is(err, errdefs.ErrNotFound) || !client.IsNotFound(err) {
		t.Fatalf("get deleted: %v", err)
	}
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != "not_found" || ce.StatusCode != 404 || !strings.Contains(ce.Error(), sb.ID) {
		t.Fatalf("error detail: %#v", err)
	}
}

func TestBadInputRejectedBeforeSending(t *testing.T) {
	c, srv := newClient(t)
	ctx := t.Context()
	for name, err := range map[string]error{
		"get empty id":    func() error { _, err := c.GetSandbox(ctx, ""); return err }(),
		"delete empty id": c.DeleteSandbox(ctx, ""),
		"no image":        func() error { _, err := c.CreateSandbox(ctx, client.SandboxSpec{}); return err }(),
		"zero timeout":    c.SetTimeout(ctx, "x", 0),
		"fork zero":       func() error { _, err := c.Fork(ctx, "x", 0); return err }(),
		"relative path":   func() error { _, err := c.Stat(ctx, "x", "etc/passwd"); return err }(),
		"depth 0":         func() error { _, err := c.ListDir(ctx, "x", "/", 0); return err }(),
		"no command":      func() error { _, err := c.Exec(ctx, client.ExecRequest{SandboxID: "x"}, nil, nil, nil); return err }(),
		"bad signal":      c.SignalExec(ctx, "x", "e", 0),
		"relative import": func() error { _, err := c.ImportImageFromPath(ctx, "a", "rel/dir", false, nil); return err }(),
	} {
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: got %v, want invalid argument", name, err)
		}
	}
	if srv.Service.Live() != 0 {
		t.Fatal("bad input created a sandbox")
	}
}

func TestServerErrorsMapToClasses(t *testing.T) {
	c, _ := newClient(t)
	ctx := t.Context()
	_, err := c.CreateSandbox(ctx, client.SandboxSpec{Image: "nope"})
	if !client.IsNotFound(err) {
		t.Fatalf("unknown image: %v", err)
	}
	if _, err := c.CreateTenant(ctx, client.Tenant{Name: "t1", Quota: client.Quota{Sandboxes: 1}}); err != nil {
		t.Fatal(err)
	}
	_, err = c.CreateTenant(ctx, client.Tenant{Name: "t1"})
	if !client.IsAlreadyExists(err) {
		t.Fatalf("duplicate tenant: %v", err)
	}
}

func TestNonJSONErrorBody(t *testing.T) {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "upstream exploded\nstack...", http.StatusBadGateway)
	}))
	t.Cleanup(hs.Close)
	c, err := client.New(hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ListImages(t.Context())
	if !errors.Is(err, errdefs.ErrUnavailable) || strings.Contains(err.Error(), "stack") || !strings.Contains(err.Error(), "upstream exploded") {
		t.Fatalf("got %q", err)
	}
}

func TestAuthOverTCP(t *testing.T) {
	srv := clienttest.NewServer(t, clienttest.ServerOptions{Images: []string{"base"}})
	anon, err := client.New(srv.Addr, client.WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anon.ListSandboxes(t.Context(), nil, ""); !client.IsUnauthenticated(err) {
		t.Fatalf("no token: %v", err)
	}
	admin, _ := client.New(srv.Addr, client.WithToken(srv.Service.AdminToken()))
	if _, err := admin.CreateTenant(t.Context(), client.Tenant{Name: "team"}); err != nil {
		t.Fatal(err)
	}
	tok, err := admin.CreateToken(t.Context(), "team", client.TokenOptions{})
	if err != nil || tok.Secret == "" {
		t.Fatalf("token = %+v, %v", tok, err)
	}
	team, _ := client.New(srv.Addr, client.WithToken(tok.Secret))
	if _, err := team.ListTenants(t.Context()); !client.IsPermissionDenied(err) {
		t.Fatalf("tenant listing tenants: %v", err)
	}
	sb, err := team.CreateSandbox(t.Context(), client.SandboxSpec{Image: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Spec.Tenant != "team" {
		t.Fatalf("tenant = %q", sb.Spec.Tenant)
	}
	if err := admin.RevokeToken(t.Context(), tok.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := team.GetSandbox(t.Context(), sb.ID); !client.IsUnauthenticated(err) {
		t.Fatalf("revoked token: %v", err)
	}
}

func mustSandbox(t *testing.T, c *client.Client) string {
	t.Helper()
	sb, err := c.CreateSandbox(t.Context(), client.SandboxSpec{Image: "base"})
	if err != nil {
		t.Fatal(err)
	}
	return sb.ID
}

func TestExecStreams(t *testing.T) {
	c, _ := newClient(t)
	id := mustSandbox(t, c)
	var out, errb bytes.Buffer
	res, err := c.Exec(t.Context(), client.ExecRequest{SandboxID: id, Shell: "echo out; echo err >&2; exit 3"}, nil, &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || out.String() != "out\n" || errb.String() != "err\n" {
		t.Fatalf("res=%+v out=%q err=%q", res, out.String(), errb.String())
	}
	// stdin is streamed to the process.
	out.Reset()
	res, err = c.Exec(t.Context(), client.ExecRequest{SandboxID: id, Args: []string{"wc", "-c"}}, strings.NewReader(strings.Repeat("x", 100000)), &out, nil)
	if err != nil || res.ExitCode != 0 || strings.TrimSpace(out.String()) != "100000" {
		t.Fatalf("wc: %+v %q %v", res, out.String(), err)
	}
	// Timeout kills the process.
	res, err = c.Exec(t.Context(), client.ExecRequest{SandboxID: id, Args: []string{"sleep", "10"}, Timeout: 200 * time.Millisecond}, nil, nil, nil)
	if err != nil || !res.TimedOut || res.Signal != "SIGKILL" {
		t.Fatalf("timeout: %+v %v", res, err)
	}
	// Exec in a missing sandbox fails with the class.
	_, err = c.Exec(t.Context(), client.ExecRequest{SandboxID: "missing", Args: []string{"true"}}, nil, nil, nil)
	if !client.IsNotFound(err) {
		t.Fatalf("missing sandbox: %v", err)
	}
}

// TestExecFullDuplex feeds stdin line by line and waits for each echo
// before sending the next: it only passes when output streams while the
// request body is still open.
func TestExecFullDuplex(t *testing.T) {
	c, _ := newClient(t)
	id := mustSandbox(t, c)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	s, err := c.StartExec(ctx, client.ExecRequest{SandboxID: id, Args: []string{"cat"}}, pr)
	if err != nil {
		t.Fatal(err)
	}
	if s.ExecID == "" || s.Pid == 0 {
		t.Fatalf("session %+v", s)
	}
	outR, outW := io.Pipe()
	done := make(chan *client.ExecResult, 1)
	go func() {
		res, err := s.Wait(outW, nil)
		if err != nil {
			outW.CloseWithError(err)
		}
		done <- res
		outW.Close()
	}()
	lines := bufio.NewReader(outR)
	for i := range 3 {
		msg := strings.Repeat("ping", i+1) + "\n"
		if _, err := io.WriteString(pw, msg); err != nil {
			t.Fatal(err)
		}
		got, err := lines.ReadString('\n')
		if err != nil || got != msg {
			t.Fatalf("echo %d = %q, %v", i, got, err)
		}
	}
	pw.Close()
	res := <-done
	if res == nil || res.ExitCode != 0 {
		t.Fatalf("cat result %+v", res)
	}
	execs, err := c.ListExecs(ctx, id)
	if err != nil || len(execs) != 1 || execs[0].ExecID != s.ExecID || execs[0].Running {
		t.Fatalf("execs = %+v, %v", execs, err)
	}
}

func TestSignalAndWaitExec(t *testing.T) {
	c, _ := newClient(t)
	id := mustSandbox(t, c)
	s, err := c.StartExec(t.Context(), client.ExecRequest{SandboxID: id, Args: []string{"sleep", "30"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	info, err := c.GetExec(t.Context(), id, s.ExecID)
	if err != nil || !info.Running {
		t.Fatalf("get exec: %+v %v", info, err)
	}
	if err := s.Signal(t.Context(), 15); err != nil {
		t.Fatal(err)
	}
	res, err := c.WaitExec(t.Context(), id, s.ExecID)
	if err != nil || res.Signal != "SIGTERM" {
		t.Fatalf("wait: %+v %v", res, err)
	}
	if _, err := c.WaitExec(t.Context(), id, "nope"); !client.IsNotFound(err) {
		t.Fatalf("wait unknown: %v", err)
	}
}

// The output an exec printed can be read again after it ended, stream by
// stream, by someone other than the caller that started it.
func TestExecOutputKept(t *testing.T) {
	c, _ := newClient(t)
	ctx := t.Context()
	id := mustSandbox(t, c)
	s, err := c.StartExec(ctx, client.ExecRequest{SandboxID: id, Shell: "echo out; echo err >&2"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := c.WaitExec(ctx, id, s.ExecID); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		stream, want string
	}{{client.Stdout, "out\n"}, {client.Stderr, "err\n"}} {
		rc, err := c.ExecOutput(ctx, id, s.ExecID, tc.stream)
		if err != nil {
			t.Fatalf("%s: %v", tc.stream, err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || string(b) != tc.want {
			t.Fatalf("%s = %q, %v; want %q", tc.stream, b, err, tc.want)
		}
	}
	if _, err := c.ExecOutput(ctx, id, s.ExecID, "stdin"); !client.IsInvalidArgument(err) {
		t.Fatalf("stream stdin: %v", err)
	}
	if _, err := c.ExecOutput(ctx, id, "nope", client.Stdout); !client.IsNotFound(err) {
		t.Fatalf("unknown exec: %v", err)
	}
}

func TestFiles(t *testing.T) {
	c, _ := newClient(t)
	ctx := t.Context()
	id := mustSandbox(t, c)
	if err := c.MakeDir(ctx, id, "/work/sub", 0); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("0123456789"), 50000)
	fi, err := c.WriteFile(ctx, id, "/work/sub/a.bin", 0o600, bytes.NewReader(data))
	if err != nil || fi.Size != int64(len(data)) || fi.Mode.Perm() != 0o600 {
		t.Fatalf("write: %+v %v", fi, err)
	}
	rc, info, err := c.ReadFile(ctx, id, "/work/sub/a.bin")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(got, data) || info.Mode.Perm() != 0o600 || info.Size != int64(len(data)) {
		t.Fatalf("read back %d bytes, info %+v", len(got), info)
	}
	list, err := c.ListDir(ctx, id, "/work", 2)
	if err != nil || len(list) != 2 {
		t.Fatalf("list depth 2: %+v %v", list, err)
	}
	if err := c.Rename(ctx, id, "/work/sub/a.bin", "/work/b.bin"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(ctx, id, "/work/sub/a.bin"); !client.IsNotFound(err) {
		t.Fatalf("stat moved: %v", err)
	}
	if st, err := c.Stat(ctx, id, "/work/b.bin"); err != nil || st.Size != int64(len(data)) {
		t.Fatalf("stat new: %+v %v", st, err)
	}
	if err := c.Remove(ctx, id, "/work", false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("remove non-empty dir: %v", err)
	}
	if err := c.Remove(ctx, id, "/work", true); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.ReadFile(ctx, id, "/work/b.bin"); !client.IsNotFound(err) {
		t.Fatalf("read removed: %v", err)
	}
}

func TestImages(t *testing.T) {
	c, _ := newClient(t)
	ctx := t.Context()
	var frames []client.ImportProgress
	tar := bytes.Repeat([]byte{1}, 300<<10)
	img, err := c.ImportImage(ctx, "py:3.12", bytes.NewReader(tar), true, func(p client.ImportProgress) { frames = append(frames, p) })
	if err != nil {
		t.Fatal(err)
	}
	if img.Name != "py:3.12" || img.Size != int64(len(tar)) || !img.Public {
		t.Fatalf("image %+v", img)
	}
	if len(frames) < 2 || !frames[len(frames)-1].Done || frames[len(frames)-1].Bytes != int64(len(tar)) {
		t.Fatalf("progress frames %+v", frames)
	}
	// An import error arrives as an error frame of the stream.
	if _, err := c.ImportImage(ctx, "empty", bytes.NewReader(nil), false, nil); !client.IsInvalidArgument(err) {
		t.Fatalf("empty import: %v", err)
	}
	if _, err := c.ImportImageFromPath(ctx, "x", "/does/not/exist", false, nil); !client.IsNotFound(err) {
		t.Fatalf("missing path: %v", err)
	}
	if _, err := c.ImportImageFromPath(ctx, "lib/tmp:1", t.TempDir(), false, nil); err != nil {
		t.Fatal(err)
	}
	// A ref with '/' survives path escaping.
	if got, err := c.GetImage(ctx, "lib/tmp:1"); err != nil || got.Name != "lib/tmp:1" {
		t.Fatalf("get lib/tmp:1: %+v %v", got, err)
	}
	imgs, err := c.ListImages(ctx)
	if err != nil || len(imgs) != 3 {
		t.Fatalf("list: %+v %v", imgs, err)
	}
	if st, err := c.ImageStats(ctx, "py:3.12"); err != nil || st.ImageBytes != int64(len(tar)) {
		t.Fatalf("stats: %+v %v", st, err)
	}
	if err := c.RemoveImage(ctx, "py:3.12"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetImage(ctx, "py:3.12"); !client.IsNotFound(err) {
		t.Fatalf("removed image: %v", err)
	}
	if _, err := c.GCImages(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestNodesAndCapacity(t *testing.T) {
	c, _ := newClient(t)
	mustSandbox(t, c)
	nodes, err := c.Nodes(t.Context())
	if err != nil || len(nodes) != 1 || nodes[0].Sandboxes != 1 {
		t.Fatalf("nodes %+v %v", nodes, err)
	}
	cp, err := c.Capacity(t.Context(), client.SandboxSpec{CPU: 1, MemoryBytes: 1 << 30})
	if err != nil || cp.Fits != 8 || cp.LimitingResource != "cpu" {
		t.Fatalf("capacity %+v %v", cp, err)
	}
}

func TestUnreachableServer(t *testing.T) {
	c, err := client.New("unix://" + t.TempDir() + "/none.sock")
	if err != nil {
		t.Fatal(err)
	}
	err = c.Health(t.Context())
	if err == nil || !strings.Contains(err.Error(), "cannot reach dsec server") {
		t.Fatalf("got %v", err)
	}
}
