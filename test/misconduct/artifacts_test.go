package misconduct

import (
	"context"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/testutil"
)

// The grader must be unfindable: an agent that reads the run's logs, the
// server's state, another sandbox's files or an API token could hand in
// the answer instead of solving the task. The attacker walks its whole
// view of the machine (/, /proc and /sys included, GNU-grep style) for
// every secret the test planted outside it.
func TestGraderArtifactsInvisible(t *testing.T) {
	testutil.RequiresRoot(t)
	c := admin(t)
	ctx := ctxT(t, 2*time.Minute)

	// Secrets outside the attacker: a token, a grader file on the host,
	// another sandbox's exec output (the "agent's logs") and files.
	if _, err := c.CreateTenant(ctx, client.Tenant{Name: "grader"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeleteTenant(context.Background(), "grader") })
	tok, err := c.CreateToken(ctx, "grader", client.TokenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	graderSecret := "reference-solution-" + hex.EncodeToString([]byte(t.Name()))[:16]
	graderDir := filepath.Join(suite.srv.Dir, "grader")
	if err := os.MkdirAll(graderDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(graderDir, "solution.txt"), []byte(graderSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	// The exec prints the secret from two halves so that no process's
	// command line holds it.
	logSecret := "agent-log-secret-4c1d"
	if out := sh(t, suite.bystander, "printf '%s%s\\n' agent-log- secret-4c1d; printf '%s%s' agent-log- secret-4c1d > /workspace/private"); out != logSecret+"\n" {
		t.Fatalf("bystander printed %q", out)
	}

	id := newSandbox(t, client.SandboxSpec{DiskBytes: 64 << 20, Env: []string{"TASK=solve-it"}})
	putAttack(t, id)

	// env, as a program sees it.
	env := sh(t, id, "env")
	for _, bad := range []string{"DSEC", "TOKEN", suite.srv.DataDir, suite.srv.Socket} {
		if strings.Contains(strings.ToUpper(env), strings.ToUpper(bad)) {
			t.Errorf("sandbox env holds %q:\n%s", bad, env)
		}
	}

	needles := map[string]string{
		"server data dir":         suite.srv.DataDir,
		"server directory":        suite.srv.Dir,
		"server socket":           suite.srv.Socket,
		"dsec binary":             suite.srv.Bin,
		"api token":               tok.Secret,
		"token id":                tok.ID,
		"grader file":             graderSecret,
		"other sandbox's output":  logSecret,
		"other sandbox's id":      suite.bystander,
		"layer daemon socket":     "layerd.sock",
		"audit log":               "audit.log",
		"server TCP listener":     suite.srv.TCPAddr,
		"sandbox state directory": "node/sandboxes",
	}
	args := []string{"walk"}
	for _, n := range needles {
		args = append(args, "-hex", hex.EncodeToString([]byte(n)))
	}
	masked := []string{"/proc/kpagecgroup", "/proc/kpageflags", "/proc/kpagecount", "/proc/kcore", "/proc/timer_list", "/proc/keys", "/proc/sched_debug"}
	for _, m := range masked {
		args = append(args, "-check", m)
	}
	args = append(args, "/")
	var w struct {
		Files    int               `json:"files"`
		Bytes    int64             `json:"bytes"`
		Matches  map[string]string `json:"matches"`
		Timeouts []string          `json:"timeouts"`
		Checked  map[string]int64  `json:"checked"`
		Slowest  map[string]int64  `json:"slowest"`
	}
	duringAttack(t, func() { attack(t, id, "", &w, args...) })
	t.Logf("walked %d files, %d bytes; blocked: %v; slowest: %v", w.Files, w.Bytes, w.Timeouts, w.Slowest)
	if w.Files < 1000 {
		t.Fatalf("the walk read only %d files: it did not cover /proc and /sys", w.Files)
	}
	for path, n := range w.Matches {
		what := ""
		for k, v := range needles {
			if v == n {
				what = k
			}
		}
		t.Errorf("%s readable inside the sandbox at %s", what, path)
	}
	for _, m := range masked {
		if n := w.Checked[m]; n > 0 {
			t.Errorf("%s: %d bytes readable, want it masked", m, n)
		}
	}
}

// The kernel crash: a recursive grep that read /proc/kpagecgroup.
// Here a real grep -r runs over the sandbox's /proc/sys and /sys/kernel,
// the tool reads the masked files directly, and writes to /proc/sys and
// /proc/sysrq-trigger fail.
func TestProcAndSysMasked(t *testing.T) {
	testutil.RequiresRoot(t)
	id := newSandbox(t, client.SandboxSpec{})
	putAttack(t, id)

	duringAttack(t, func() {
		r := execIn(t, id, client.ExecRequest{Shell: "grep -rs dsec /proc/sys >/dev/null; echo done", Timeout: time.Minute})
		if r.TimedOut || !strings.HasSuffix(r.stdout, "done\n") {
			t.Errorf("grep -r did not finish: %+v %q", r.ExecResult, r.stderr)
		}
	})

	var reads map[string]struct {
		N     int    `json:"n"`
		Err   string `json:"err"`
		Bytes string `json:"bytes"`
	}
	attack(t, id, "", &reads, "read", "/proc/kpagecgroup", "/proc/kpageflags", "/proc/kpagecount", "/proc/kcore",
		"/proc/1/exe", "/proc/1/environ", "/proc/1/root/etc/hostname", "/proc/1/fd/0", "/sys/firmware/memmap/0/type")
	for _, p := range []string{"/proc/kpagecgroup", "/proc/kpageflags", "/proc/kpagecount", "/proc/kcore", "/sys/firmware/memmap/0/type"} {
		if r := reads[p]; r.N > 0 {
			t.Errorf("%s: read %d bytes (%q), want nothing", p, r.N, r.Bytes)
		}
	}
	// The sandbox's PID 1 is dsec's init: its binary, environment, root
	// and descriptors are the host's business.
	for _, p := range []string{"/proc/1/exe", "/proc/1/environ", "/proc/1/root/etc/hostname", "/proc/1/fd/0"} {
		if r := reads[p]; r.Err == "ok" && r.N > 0 {
			t.Errorf("%s: readable (%d bytes, %q)", p, r.N, r.Bytes)
		}
		if r := reads[p+"#readlink"]; r.Err == "ok" {
			t.Errorf("readlink %s = %q", p, r.Bytes)
		}
	}

	hostHostname, err := os.ReadFile("/proc/sys/kernel/hostname")
	if err != nil {
		t.Fatal(err)
	}
	hostDropCaches, _ := os.ReadFile("/proc/sys/vm/overcommit_memory")
	for _, tc := range []struct{ path, data string }{
		{"/proc/sys/kernel/hostname", "pwned"},
		{"/proc/sys/vm/overcommit_memory", "1"},
		{"/proc/sys/kernel/panic", "1"},
		{"/proc/sysrq-trigger", "h"},
		{"/sys/kernel/mm/transparent_hugepage/enabled", "always"},
	} {
		var w map[string]string
		attack(t, id, "", &w, "write", tc.path, tc.data)
		if w["open"] == "ok" && w["write"] == "ok" {
			t.Errorf("write to %s succeeded", tc.path)
		}
	}
	if b, _ := os.ReadFile("/proc/sys/kernel/hostname"); string(b) != string(hostHostname) {
		t.Errorf("host hostname changed: %q -> %q", hostHostname, b)
	}
	if b, _ := os.ReadFile("/proc/sys/vm/overcommit_memory"); string(b) != string(hostDropCaches) {
		t.Errorf("host overcommit_memory changed: %q -> %q", hostDropCaches, b)
	}
	assertHealthy(t)
}

// Forging calls to the server: the sandbox finds no unix socket at all (its
// own mount and network namespaces), and connecting to the server's socket
// path, the default one or the layer daemon's fails.
func TestServerSocketUnreachable(t *testing.T) {
	testutil.RequiresRoot(t)
	id := newSandbox(t, client.SandboxSpec{})
	putAttack(t, id)
	var u struct {
		Found     []string          `json:"found"`
		Connected map[string]string `json:"connected"`
		Errors    map[string]string `json:"errors"`
	}
	for _, user := range []string{"", "user"} {
		attack(t, id, user, &u, "unix", suite.srv.Socket, "/run/dsec/dsec.sock", filepath.Join(suite.srv.DataDir, "layerd.sock"), "@dsec", "@layerd")
		if len(u.Found) > 0 {
			t.Errorf("user %q: unix sockets visible in the sandbox: %v", user, u.Found)
		}
		for p, reply := range u.Connected {
			t.Errorf("user %q: connected to %s, which answered %q", user, p, reply)
		}
		if len(u.Errors) < 5 {
			t.Errorf("user %q: only %d connection attempts: %v", user, len(u.Errors), u.Errors)
		}
	}
	// The socket itself is root-only on the host.
	fi, err := os.Stat(suite.srv.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("server socket mode %v, want a 0600 socket", fi.Mode())
	}
	assertHealthy(t)
}

// The grader reads results through the file API; an agent that plants a
// FIFO (the read would block the grader), a device (endless bytes), a
// symlink out of its root or into /proc gets a clear refusal at once, and
// a write goes through the sandbox's disk limit like any other.
func TestFileAPIAbuse(t *testing.T) {
	testutil.RequiresRoot(t)
	id := newSandbox(t, client.SandboxSpec{DiskBytes: 64 << 20})
	sh(t, id, `mkfifo /workspace/result.fifo
ln -s /dev/zero /workspace/result.zero
ln -s /proc/1/environ /workspace/result.env
ln -s ../../../../../../../etc/shadow /workspace/result.up
ln -s /proc/self/root/../../../etc/hostname /workspace/result.proc
echo 'sandbox shadow' > /etc/shadow`)
	c := admin(t)
	for _, p := range []string{"/workspace/result.fifo", "/workspace/result.zero", "/workspace/result.env", "/workspace/result.proc", "/dev/zero", "/proc/self/environ"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		rc, _, err := c.ReadFile(ctx, id, p)
		if err == nil {
			n, _ := io.Copy(io.Discard, io.LimitReader(rc, 1<<20))
			rc.Close()
			t.Errorf("read %s: %d bytes, want a refusal", p, n)
		} else if time.Since(start) > 5*time.Second {
			t.Errorf("read %s took %v", p, time.Since(start))
		}
		cancel()
	}
	// A symlink climbing out resolves inside the sandbox's root.
	rc, _, err := c.ReadFile(ctxT(t, 10*time.Second), id, "/workspace/result.up")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "sandbox shadow\n" {
		t.Errorf("../../etc/shadow from the sandbox read %q", b)
	}
	// A write larger than the disk fails cleanly and leaves no partial file.
	_, err = c.WriteFile(ctxT(t, time.Minute), id, "/workspace/huge", 0o644, io.LimitReader(zeroReader{}, 128<<20))
	if err == nil {
		t.Error("a 128 MiB write into a 64 MiB disk succeeded")
	}
	if _, err := c.Stat(ctxT(t, 10*time.Second), id, "/workspace/huge"); !client.IsNotFound(err) {
		t.Errorf("partial file after a failed write: %v", err)
	}
	assertHealthy(t)
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
