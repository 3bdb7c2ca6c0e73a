package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/client/clienttest"
)

// cli runs dsec in-process against the server at DSEC_ADDR.
func cli(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(args, strings.NewReader(stdin), &o, &e)
	return o.String(), e.String(), code
}

// ok runs dsec and fails the test unless it exits 0.
func ok(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, code := cli(t, "", args...)
	if code != 0 {
		t.Fatalf("dsec %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
	}
	return out
}

func jsonOut[T any](t *testing.T, args ...string) T {
	t.Helper()
	var v T
	out := ok(t, args...)
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("dsec %s: output is not JSON: %v\n%s", strings.Join(args, " "), err, out)
	}
	return v
}

func startServer(t *testing.T) *clienttest.Server {
	t.Helper()
	srv := clienttest.NewServer(t, clienttest.ServerOptions{Unix: true, Images: []string{"base"}})
	t.Setenv("DSEC_ADDR", srv.Addr)
	t.Setenv("DSEC_TOKEN", "")
	return srv
}

func TestCLIErrorsAndUsage(t *testing.T) {
	startServer(t)
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"bogus"}, 2, `unknown command "bogus"`},
		{[]string{"sandbox", "bogus"}, 2, `unknown command "bogus" for "dsec sandbox"`},
		{[]string{"sandbox"}, 2, "needs a subcommand"},
		{[]string{"sandbox", "inspect"}, 2, "needs a sandbox ID"},
		{[]string{"sandbox", "create"}, 2, "--image is required"},
		{[]string{"sandbox", "create", "--image", "base", "--memory", "lots"}, 2, `invalid size "lots"`},
		{[]string{"sandbox", "create", "--image", "base", "--nope"}, 2, "unknown flag: --nope"},
		{[]string{"sandbox", "create", "--image", "base", "--on-idle", "nap"}, 2, "invalid --on-idle"},
		{[]string{"sandbox", "timeout", "x", "5"}, 2, "use Go syntax"},
		{[]string{"exec", "sb-x"}, 2, "needs a sandbox ID and a command"},
		{[]string{"file", "put", "x", "/nonexistent/local", "/a"}, 1, "no such file"},
		{[]string{"file", "put", "x", "-", "/a", "--mode", "9"}, 2, "invalid mode"},
		{[]string{"sandbox", "inspect", "sb-missing"}, 1, "sb-missing"},
		{[]string{"sandbox", "create", "--image", "nope"}, 1, "image nope"},
		{[]string{"file", "stat", "x", "relative"}, 1, "must be absolute"},
		{[]string{"bench", "create", "--n", "0", "--image", "base"}, 2, "at least 1"},
		{[]string{"top", "--interval", "1ms"}, 2, "at least 100ms"},
	} {
		out, errOut, code := cli(t, "", tc.args...)
		if code != tc.code || !strings.HasPrefix(errOut, "dsec: ") || !strings.Contains(errOut, tc.msg) {
			t.Errorf("dsec %v: exit %d stderr %q stdout %q; want exit %d and %q", tc.args, code, errOut, out, tc.code, tc.msg)
		}
		if strings.Count(strings.TrimSpace(errOut), "\n") > 0 && tc.code == 1 {
			t.Errorf("dsec %v: error is not one line: %q", tc.args, errOut)
		}
	}
	// Every command answers --help with exit 0.
	for _, args := range [][]string{{"--help"}, {"sandbox", "create", "--help"}, {"exec", "--help"}, {"bench", "density", "--help"},
		{"image", "import", "--help"}, {"file", "get", "--help"}, {"top", "--help"}, {"token", "create", "--help"}} {
		out, _, code := cli(t, "", args...)
		if code != 0 || !strings.Contains(out, "Usage:") {
			t.Errorf("dsec %v: exit %d, output %q", args, code, out)
		}
	}
}

func TestCLIUnreachable(t *testing.T) {
	t.Setenv("DSEC_ADDR", "unix://"+t.TempDir()+"/none.sock")
	_, errOut, code := cli(t, "", "sandbox", "ls")
	if code != 1 || !strings.Contains(errOut, "cannot reach dsec server") {
		t.Fatalf("exit %d: %q", code, errOut)
	}
}

func TestCLISandboxLifecycle(t *testing.T) {
	srv := startServer(t)
	id := strings.TrimSpace(ok(t, "sandbox", "create", "--image", "base", "--cpu", "0.5", "--memory", "256Mi", "--disk", "1Gi",
		"--pids", "128", "--idle-ttl", "300s", "--max-lifetime", "3h", "--on-idle", "pause", "--env", "SEED=7",
		"--label", "run=a", "--qos", "batch", "--allow", "preset:pypi", "--allow", "10.0.0.0/8:443/tcp", "--deny", "10.0.0.5"))
	if !strings.HasPrefix(id, "sb-") || strings.Contains(id, "\n") {
		t.Fatalf("create printed %q", id)
	}
	sb := jsonOut[client.Sandbox](t, "sandbox", "inspect", id, "--json")
	s := sb.Spec
	if s.CPU != 0.5 || s.MemoryBytes != 256<<20 || s.DiskBytes != 1<<30 || s.Pids != 128 || s.IdleTTL != 300*time.Second ||
		s.MaxLifetime != 3*time.Hour || s.OnIdle != "pause" || s.QoS != "batch" || s.Env[0] != "SEED=7" || s.Labels["run"] != "a" ||
		len(s.Network.Allow) != 2 || s.Network.Allow[0].Preset != "pypi" || s.Network.Allow[1].Ports != "443" || s.Network.Deny[0].CIDR != "10.0.0.5" {
		t.Fatalf("spec on the server: %+v", s)
	}
	human := ok(t, "sandbox", "inspect", id)
	if !strings.Contains(human, "256Mi") || !strings.Contains(human, "preset:pypi 10.0.0.0/8:443/tcp") {
		t.Fatalf("inspect:\n%s", human)
	}
	other := strings.TrimSpace(ok(t, "sandbox", "create", "--image", "base", "--label", "run=b"))

	list := jsonOut[[]client.Sandbox](t, "sandbox", "ls", "--label", "run=a", "--json")
	if len(list) != 1 || list[0].ID != id {
		t.Fatalf("ls --label run=a: %+v", list)
	}
	table := ok(t, "sandbox", "ls")
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") {
		t.Fatalf("ls table:\n%s", table)
	}
	// Columns line up: the STATE column starts at the same offset in every row.
	col := strings.Index(lines[0], "STATE")
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l[col:], "running") {
			t.Fatalf("misaligned table:\n%s", table)
		}
	}
	ok(t, "sandbox", "pause", id)
	if got := strings.TrimSpace(ok(t, "sandbox", "ls", "-q", "--state", "paused")); got != id {
		t.Fatalf("ls paused = %q", got)
	}
	ok(t, "sandbox", "resume", id)
	ok(t, "sandbox", "timeout", id, "10m")
	st := jsonOut[client.SandboxStats](t, "sandbox", "stats", id, "--json")
	if st.CPURequested != 0.5 || st.MemoryLimitBytes != 256<<20 {
		t.Fatalf("stats %+v", st)
	}
	if !strings.Contains(ok(t, "sandbox", "stats", id), "limit") {
		t.Fatal("stats table")
	}
	ok(t, "sandbox", "network", id, "--allow", "1.1.1.1:53/udp")
	if sb := jsonOut[client.Sandbox](t, "sandbox", "inspect", id, "--json"); len(sb.Spec.Network.Allow) != 1 || sb.Spec.Network.Allow[0].Protocol != "udp" || len(sb.Spec.Network.Deny) != 0 {
		t.Fatalf("network replaced: %+v", sb.Spec.Network)
	}
	if out := ok(t, "sandbox", "snapshot", id, "snap:1"); !strings.HasPrefix(out, "snap:1 sha256:") {
		t.Fatalf("snapshot printed %q", out)
	}
	forks := strings.Fields(ok(t, "sandbox", "fork", id, "--count", "2"))
	if len(forks) != 2 {
		t.Fatalf("fork printed %v", forks)
	}
	if srv.Service.Live() != 4 {
		t.Fatalf("live = %d", srv.Service.Live())
	}
	// rm deletes what it can and fails on the rest.
	out, errOut, code := cli(t, "", "sandbox", "rm", id, "sb-nope", other, forks[0], forks[1])
	if code != 1 || !strings.Contains(errOut, "sb-nope") || len(strings.Fields(out)) != 4 {
		t.Fatalf("rm: exit %d out %q err %q", code, out, errOut)
	}
	if srv.Service.Live() != 0 {
		t.Fatalf("live after rm = %d", srv.Service.Live())
	}
}

func TestCLIExec(t *testing.T) {
	startServer(t)
	id := strings.TrimSpace(ok(t, "sandbox", "create", "--image", "base", "--env", "FROM_SPEC=1"))
	out, errOut, code := cli(t, "", "exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
	if code != 7 || out != "out\n" || errOut != "err\n" {
		t.Fatalf("exit %d out %q err %q", code, out, errOut)
	}
	out, _, code = cli(t, "", "exec", id, "--env", "X=42", "--shell", "--", "echo", "$X$FROM_SPEC")
	if code != 0 || out != "421\n" {
		t.Fatalf("--shell/--env: exit %d out %q", code, out)
	}
	ok(t, "file", "mkdir", id, "/w")
	if out := ok(t, "exec", id, "--cwd", "/w", "--", "sh", "-c", "pwd"); !strings.HasSuffix(strings.TrimSpace(out), "/w") {
		t.Fatalf("--cwd: %q", out)
	}
	// Without -i stdin is not sent; with -i it is.
	if out, _, _ := cli(t, "typed", "exec", id, "--", "cat"); out != "" {
		t.Fatalf("stdin leaked without -i: %q", out)
	}
	if out, _, code := cli(t, "typed\n", "exec", "-i", id, "--", "cat"); code != 0 || out != "typed\n" {
		t.Fatalf("-i: %d %q", code, out)
	}
	if _, _, code := cli(t, "", "exec", id, "--", "sh", "-c", "kill -9 $$"); code != 137 {
		t.Fatalf("killed: exit %d, want 137", code)
	}
	_, errOut, code = cli(t, "", "exec", id, "--timeout", "200ms", "--", "sleep", "5")
	if code != 137 || !strings.Contains(errOut, "timed out") {
		t.Fatalf("timeout: exit %d, %q", code, errOut)
	}
	if _, errOut, code := cli(t, "", "exec", "sb-none", "--", "true"); code != 1 || !strings.Contains(errOut, "sb-none") {
		t.Fatalf("missing sandbox: %d %q", code, errOut)
	}
}

func TestCLIFiles(t *testing.T) {
	startServer(t)
	id := strings.TrimSpace(ok(t, "sandbox", "create", "--image", "base"))
	dir := t.TempDir()
	local := filepath.Join(dir, "in.txt")
	data := strings.Repeat("line\n", 10000)
	if err := os.WriteFile(local, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	ok(t, "file", "mkdir", id, "/data/sub")
	ok(t, "file", "put", id, local, "/data/a.txt", "--mode", "0600")
	if _, _, code := cli(t, "from stdin", "file", "put", id, "-", "/data/sub/b.txt"); code != 0 {
		t.Fatal("put from stdin")
	}
	if out := ok(t, "file", "get", id, "/data/sub/b.txt", "-"); out != "from stdin" {
		t.Fatalf("get - = %q", out)
	}
	dst := filepath.Join(dir, "out.txt")
	ok(t, "file", "get", id, "/data/a.txt", dst)
	got, err := os.ReadFile(dst)
	if err != nil || string(got) != data {
		t.Fatalf("downloaded %d bytes, %v", len(got), err)
	}
	if st, _ := os.Stat(dst); st.Mode().Perm() != 0o600 {
		t.Fatalf("downloaded mode %v", st.Mode())
	}
	// A failed download leaves no file behind.
	if _, _, code := cli(t, "", "file", "get", id, "/data/none", filepath.Join(dir, "none")); code != 1 {
		t.Fatal("get of missing file succeeded")
	}
	if _, err := os.Stat(filepath.Join(dir, "none")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("failed get left a file: %v", err)
	}
	fi := jsonOut[client.FileInfo](t, "file", "stat", id, "/data/a.txt", "--json")
	if fi.Size != int64(len(data)) || fi.Mode.Perm() != 0o600 {
		t.Fatalf("stat %+v", fi)
	}
	if l := jsonOut[[]client.FileInfo](t, "file", "ls", id, "/data", "--json"); len(l) != 2 {
		t.Fatalf("ls depth 1: %+v", l)
	}
	if l := jsonOut[[]client.FileInfo](t, "file", "ls", id, "/data", "--depth", "2", "--json"); len(l) != 3 {
		t.Fatalf("ls depth 2: %+v", l)
	}
	if out := ok(t, "file", "ls", id, "/data"); !strings.Contains(out, "/data/a.txt") || !strings.Contains(out, "-rw-------") {
		t.Fatalf("ls table:\n%s", out)
	}
	ok(t, "file", "mv", id, "/data/a.txt", "/data/c.txt")
	if _, errOut, code := cli(t, "", "file", "stat", id, "/data/a.txt"); code != 1 || !strings.Contains(errOut, "no such file") {
		t.Fatalf("stat moved: %d %q", code, errOut)
	}
	if _, _, code := cli(t, "", "file", "rm", id, "/data"); code != 1 {
		t.Fatal("rm of non-empty dir without -r succeeded")
	}
	ok(t, "file", "rm", id, "-r", "/data")
	for _, f := range jsonOut[[]client.FileInfo](t, "file", "ls", id, "/", "--json") {
		if strings.HasPrefix(f.Path, "/data") {
			t.Fatalf("rm -r left %s", f.Path)
		}
	}
}

func TestCLIImages(t *testing.T) {
	srv := startServer(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hello"), bytes.Repeat([]byte("x"), 200<<10), 0o755); err != nil {
		t.Fatal(err)
	}
	// Local server: it reads the path itself (the fake records the
	// directory's own size, not a tar's).
	img := jsonOut[client.ImageInfo](t, "image", "import", "local:1", dir, "--json")
	st, _ := os.Stat(dir)
	if img.Name != "local:1" || img.Size != st.Size() {
		t.Fatalf("path import: %+v (dir size %d)", img, st.Size())
	}
	// --upload streams a tar of the directory, with progress lines.
	out, errOut, code := cli(t, "", "image", "import", "up:1", dir, "--upload", "--progress", "--public")
	if code != 0 || !strings.HasPrefix(out, "up:1 sha256:") || !strings.Contains(errOut, "layer 1/1") {
		t.Fatalf("upload: %d %q %q", code, out, errOut)
	}
	up := jsonOut[client.ImageInfo](t, "image", "inspect", "up:1", "--json")
	if up.Size <= 200<<10 || !up.Public {
		t.Fatalf("uploaded image %+v", up)
	}
	// A single file is uploaded as is.
	f := filepath.Join(dir, "hello")
	if got := jsonOut[client.ImageInfo](t, "image", "import", "file:1", f, "--upload", "--json"); got.Size != 200<<10 {
		t.Fatalf("file upload size %d", got.Size)
	}
	if _, errOut, code := cli(t, "", "image", "import", "x", filepath.Join(dir, "missing")); code != 1 || !strings.Contains(errOut, "no such file") {
		t.Fatalf("missing path: %d %q", code, errOut)
	}
	imgs := jsonOut[[]client.ImageInfo](t, "image", "ls", "--json")
	if len(imgs) != 4 {
		t.Fatalf("ls: %+v", imgs)
	}
	if out := ok(t, "image", "ls"); !strings.Contains(out, "up:1") || !strings.HasPrefix(out, "NAME") {
		t.Fatalf("ls table:\n%s", out)
	}
	if s := jsonOut[client.ImageStats](t, "image", "stats", "up:1", "--json"); s.Image != "up:1" {
		t.Fatalf("stats %+v", s)
	}
	ok(t, "image", "rm", "up:1")
	if _, _, code := cli(t, "", "image", "inspect", "up:1"); code != 1 {
		t.Fatal("removed image still there")
	}
	if out := ok(t, "image", "gc"); !strings.Contains(out, "removed") {
		t.Fatalf("gc: %q", out)
	}
	if _, errOut, code := cli(t, "", "image", "pull", "docker.io/library/alpine"); code != 1 || !strings.Contains(errOut, "use `dsec image import`") {
		t.Fatalf("pull: %d %q", code, errOut)
	}
	_ = srv
}

func TestWriteTar(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "usr/bin"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "usr/bin/tool"), []byte("#!/bin/sh\n"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "secret"), []byte("s"), 0o600))
	must(os.Symlink("usr/bin/tool", filepath.Join(dir, "link")))
	var buf bytes.Buffer
	must(writeTar(context.Background(), &buf, dir))
	tr := tar.NewReader(&buf)
	got := map[string]*tar.Header{}
	bodies := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		must(err)
		got[h.Name] = h
		b, _ := io.ReadAll(tr)
		bodies[h.Name] = string(b)
	}
	for name, want := range map[string]struct {
		typ  byte
		mode int64
	}{
		"usr/": {tar.TypeDir, 0o755}, "usr/bin/": {tar.TypeDir, 0o755}, "usr/bin/tool": {tar.TypeReg, 0o755},
		"secret": {tar.TypeReg, 0o600}, "link": {tar.TypeSymlink, 0o777},
	} {
		h := got[name]
		if h == nil || h.Typeflag != want.typ || h.Mode&0o777 != want.mode {
			t.Errorf("entry %s = %+v, want type %c mode %o", name, h, want.typ, want.mode)
		}
	}
	if len(got) != 5 || got["link"].Linkname != "usr/bin/tool" || bodies["usr/bin/tool"] != "#!/bin/sh\n" {
		t.Fatalf("tar entries %v", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := writeTar(ctx, io.Discard, dir); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled tar: %v", err)
	}
}

func TestCLITenantsTokensNodes(t *testing.T) {
	startServer(t)
	ok(t, "tenant", "create", "team", "--sandboxes", "5", "--cpu", "4", "--memory", "8Gi", "--disk", "100Gi")
	ts := jsonOut[[]client.Tenant](t, "tenant", "ls", "--json")
	var team *client.Tenant
	for i := range ts {
		if ts[i].Name == "team" {
			team = &ts[i]
		}
	}
	if team == nil || team.Quota.Sandboxes != 5 || team.Quota.MemoryBytes != 8<<30 || team.Quota.DiskBytes != 100<<30 {
		t.Fatalf("tenants %+v", ts)
	}
	if out := ok(t, "tenant", "ls"); !strings.Contains(out, "team") || !strings.Contains(out, "8Gi") {
		t.Fatalf("tenant table:\n%s", out)
	}
	if _, errOut, code := cli(t, "", "tenant", "create", "team"); code != 1 || !strings.Contains(errOut, "already exists") {
		t.Fatalf("duplicate tenant: %d %q", code, errOut)
	}
	out, errOut, code := cli(t, "", "token", "create", "--tenant", "team")
	if code != 0 || !strings.HasPrefix(out, "dsec_") || !strings.Contains(errOut, "shown only once") {
		t.Fatalf("token create: %d %q %q", code, out, errOut)
	}
	tok := jsonOut[client.Token](t, "token", "create", "--tenant", "team", "--json")
	if tok.ID == "" || tok.Secret == "" {
		t.Fatalf("token %+v", tok)
	}
	ok(t, "token", "revoke", tok.ID)
	if _, _, code := cli(t, "", "token", "create"); code != 2 {
		t.Fatal("token create without --tenant")
	}
	ok(t, "tenant", "rm", "team")

	nodes := jsonOut[[]client.NodeInfo](t, "node", "ls", "--json")
	if len(nodes) != 1 || nodes[0].CPUs != clienttest.NodeCPUs {
		t.Fatalf("nodes %+v", nodes)
	}
	if out := ok(t, "node", "ls"); !strings.Contains(out, "fake-node") {
		t.Fatalf("node table:\n%s", out)
	}
	cp := jsonOut[client.Capacity](t, "node", "capacity", "--cpu", "2", "--memory", "1Gi", "--json")
	if cp.Fits != 4 || cp.LimitingResource != "cpu" {
		t.Fatalf("capacity %+v", cp)
	}
	cp = jsonOut[client.Capacity](t, "node", "capacity", "--cpu", "0.01", "--memory", "4Gi", "--json")
	if cp.LimitingResource != "memory" || cp.Fits != 3 { // 12Gi available / 4Gi
		t.Fatalf("capacity by memory %+v", cp)
	}
	if out := ok(t, "node", "capacity"); !strings.Contains(out, "limited by cpu") {
		t.Fatalf("capacity text %q", out)
	}
}

func TestCLITop(t *testing.T) {
	startServer(t)
	for range 2 {
		ok(t, "sandbox", "create", "--image", "base", "--cpu", "1", "--memory", "512Mi")
	}
	id := strings.TrimSpace(ok(t, "sandbox", "create", "--image", "base", "--cpu", "2"))
	ok(t, "sandbox", "pause", id)
	out := ok(t, "top", "--once")
	for _, want := range []string{
		"3  (running 2, paused 1, creating 0, dead 0)",
		"0.00 used / 4.00 requested / 8 cores",
		"9Mi held", "limiting resource: cpu", "4 more of cpu 1",
		id,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("top frame lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\033[") {
		t.Error("--once frame contains terminal escapes")
	}
}

// TestCLIExecInterrupt delivers a real SIGINT to the CLI while a remote
// command runs: it must be forwarded to the command (which dies of it,
// exit 130), not abandon it.
func TestCLIExecInterrupt(t *testing.T) {
	srv := startServer(t)
	id := strings.TrimSpace(ok(t, "sandbox", "create", "--image", "base"))
	done := make(chan int, 1)
	var stderr bytes.Buffer
	go func() {
		done <- run([]string{"exec", id, "--", "sleep", "30"}, strings.NewReader(""), io.Discard, &stderr)
	}()
	c, err := client.New(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		execs, err := c.ListExecs(t.Context(), id)
		if err == nil && len(execs) == 1 && execs[0].Running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("exec never started: %v %v", execs, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 130 {
			t.Fatalf("exit %d after SIGINT, want 130; stderr %q", code, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("dsec exec did not end after SIGINT")
	}
}
