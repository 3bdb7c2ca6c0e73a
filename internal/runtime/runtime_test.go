package runtime_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/runtime"
)

// assertGone checks that nothing of a destroyed sandbox is left: no
// process, no cgroup, no directory, no mount.
func (e *env) assertGone(st *runtime.State, paths map[string]string) {
	e.t.Helper()
	// An adopted init is reaped by the host's init, maybe a moment later.
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := unix.Kill(st.Pid, 0)
		if errors.Is(err, unix.ESRCH) || isZombie(st.Pid) {
			// A zombie has ended; reaping it is up to its parent (for an
			// adopted init, the host's init, which may take its time).
			break
		}
		if time.Now().After(deadline) {
			e.t.Errorf("init pid %d still exists (kill 0: %v)", st.Pid, err)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for c, p := range paths {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			e.t.Errorf("cgroup %s dir %s still exists", c, p)
		}
	}
	if _, err := os.Stat(st.Dir); !os.IsNotExist(err) {
		e.t.Errorf("sandbox dir %s still exists", st.Dir)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		e.t.Fatal(err)
	}
	if strings.Contains(string(mi), st.Dir) {
		e.t.Errorf("host mountinfo mentions %s", st.Dir)
	}
}

func (e *env) groupPaths(st *runtime.State) map[string]string {
	e.t.Helper()
	g, err := e.cg.Load(context.Background(), st.Cgroup)
	if err != nil {
		e.t.Fatal(err)
	}
	return g.Paths()
}

func TestCreateExecDestroy(t *testing.T) {
	e := newEnv(t)
	st := e.create("ced1")
	if !e.rt.Alive("ced1") {
		t.Fatal("not alive after create")
	}
	if got := e.mustSh("ced1", "echo hello"); got != "hello\n" {
		t.Fatalf("stdout %q", got)
	}
	paths := e.groupPaths(st)
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), st.Dir) {
		t.Fatalf("sandbox mounts leaked into the host mount table")
	}
	if err := e.rt.Destroy(context.Background(), "ced1"); err != nil {
		t.Fatal(err)
	}
	e.assertGone(st, paths)
	if e.rt.Alive("ced1") {
		t.Fatal("alive after destroy")
	}
	// Destroying again, or a sandbox that never existed, is fine.
	if err := e.rt.Destroy(context.Background(), "ced1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.Start(context.Background(), "ced1", runtime.Process{Args: []string{"true"}}, runtime.IO{}); !errdefs.IsNotFound(err) {
		t.Fatalf("exec after destroy: %v, want not found", err)
	}
}

func TestExec(t *testing.T) {
	e := newEnv(t)
	e.create("ex1")
	tests := []struct {
		name   string
		p      runtime.Process
		stdin  string
		code   int
		signal string
		stdout string
		stderr string
	}{
		{name: "exit code", p: runtime.Process{Args: []string{"sh", "-c", "exit 7"}}, code: 7},
		{name: "stderr", p: runtime.Process{Args: []string{"sh", "-c", "echo oops >&2"}}, stderr: "oops\n"},
		{name: "default env", p: runtime.Process{Args: []string{"sh", "-c", "echo $DSEC_TEST_DEFAULT"}}, stdout: "1\n"},
		{name: "env overrides", p: runtime.Process{Args: []string{"sh", "-c", "echo $DSEC_TEST_DEFAULT $FOO"}, Env: []string{"DSEC_TEST_DEFAULT=2", "FOO=bar baz"}}, stdout: "2 bar baz\n"},
		{name: "path lookup", p: runtime.Process{Args: []string{"echo", "a", "b"}}, stdout: "a b\n"},
		{name: "cwd", p: runtime.Process{Args: []string{"pwd"}, Cwd: "/etc"}, stdout: "/etc\n"},
		{name: "root by default", p: runtime.Process{Args: []string{"id"}}, stdout: "uid=0(root) gid=0(root) groups=0(root)\n"},
		{name: "user by name", p: runtime.Process{Args: []string{"id"}, User: "alice"}, stdout: "uid=1000(alice) gid=1000(alice) groups=50(staff),1000(alice)\n"},
		{name: "user by uid:gid", p: runtime.Process{Args: []string{"id"}, User: "1000:50"}, stdout: "uid=1000(alice) gid=50(staff) groups=50(staff)\n"},
		{name: "uid without passwd entry", p: runtime.Process{Args: []string{"id"}, User: "4242"}, stdout: "uid=4242 gid=0(root) groups=0(root)\n"},
		{name: "home of user", p: runtime.Process{Args: []string{"sh", "-c", "echo $HOME"}, User: "alice"}, stdout: "/home/alice\n"},
		{name: "stdin", p: runtime.Process{Args: []string{"sh", "-c", "tr a-z A-Z"}}, stdin: "hello\nworld\n", stdout: "HELLO\nWORLD\n"},
		{name: "killed by signal", p: runtime.Process{Args: []string{"sh", "-c", "kill -9 $$"}}, code: 128 + 9, signal: "SIGKILL"},
		{name: "tty", p: runtime.Process{Args: []string{"sh", "-c", "test -t 0 && test -t 1 && test -t 2 && tty && echo err >&2"}, Tty: true}, stdout: "/dev/pts/0\r\nerr\r\n"},
		// The terminal echoes input when it arrives, before the shell reads it.
		{name: "tty stdin", p: runtime.Process{Args: []string{"sh", "-c", "read x; echo got $x"}, Tty: true}, stdin: "hi\n", stdout: "hi\r\ngot hi\r\n"},
		{name: "no new privileges", p: runtime.Process{Args: []string{"sh", "-c", "grep NoNewPrivs /proc/self/status"}}, stdout: "NoNewPrivs:\t1\n"},
		{name: "bounding set", p: runtime.Process{Args: []string{"sh", "-c", "grep CapBnd /proc/self/status"}}, stdout: fmt.Sprintf("CapBnd:\t%016x\n", runtime.DefaultCaps)},
		{name: "non-root has no caps", p: runtime.Process{Args: []string{"sh", "-c", "grep CapEff /proc/self/status"}, User: "alice"}, stdout: "CapEff:\t0000000000000000\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := e.run("ex1", tc.p, tc.stdin)
			if err != nil {
				t.Fatal(err)
			}
			if r.ExitCode != tc.code || r.Signal != tc.signal || r.stdout != tc.stdout || r.stderr != tc.stderr {
				t.Fatalf("got exit %d signal %q stdout %q stderr %q; want %d %q %q %q",
					r.ExitCode, r.Signal, r.stdout, r.stderr, tc.code, tc.signal, tc.stdout, tc.stderr)
			}
			if r.TimedOut || r.StdoutTruncated || r.StderrTruncated || r.OutputCap != runtime.DefaultOutputCap {
				t.Fatalf("unexpected flags %+v", r.ExecResult)
			}
			// What was streamed is also kept on disk.
			out, err := e.rt.ExecOutput("ex1", r.ExecID, "stdout")
			if err != nil || string(out) != tc.stdout {
				t.Fatalf("kept stdout %q, %v", out, err)
			}
			res, done, err := e.rt.ExecResult("ex1", r.ExecID)
			if err != nil || !done || res.ExitCode != tc.code {
				t.Fatalf("ExecResult: %+v %v %v", res, done, err)
			}
		})
	}
}

func TestExecErrors(t *testing.T) {
	e := newEnv(t)
	e.create("exerr")
	ctx := context.Background()
	tests := []struct {
		name  string
		id    string
		p     runtime.Process
		class error
	}{
		{"no args", "exerr", runtime.Process{}, errdefs.ErrInvalidArgument},
		{"empty command", "exerr", runtime.Process{Args: []string{""}}, errdefs.ErrInvalidArgument},
		{"NUL in arg", "exerr", runtime.Process{Args: []string{"echo", "a\x00b"}}, errdefs.ErrInvalidArgument},
		{"env without =", "exerr", runtime.Process{Args: []string{"true"}, Env: []string{"FOO"}}, errdefs.ErrInvalidArgument},
		{"relative cwd", "exerr", runtime.Process{Args: []string{"true"}, Cwd: "etc"}, errdefs.ErrInvalidArgument},
		{"negative timeout", "exerr", runtime.Process{Args: []string{"true"}, Timeout: -1}, errdefs.ErrInvalidArgument},
		{"missing command", "exerr", runtime.Process{Args: []string{"no-such-command"}}, errdefs.ErrInvalidArgument},
		{"missing cwd", "exerr", runtime.Process{Args: []string{"true"}, Cwd: "/nope"}, errdefs.ErrInvalidArgument},
		{"unknown user", "exerr", runtime.Process{Args: []string{"true"}, User: "mallory"}, errdefs.ErrInvalidArgument},
		{"unknown group", "exerr", runtime.Process{Args: []string{"true"}, User: "alice:nogrp"}, errdefs.ErrInvalidArgument},
		{"unknown sandbox", "nope", runtime.Process{Args: []string{"true"}}, errdefs.ErrNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.rt.Start(ctx, tc.id, tc.p, runtime.IO{})
			if !errors.Is(err, tc.class) {
				t.Fatalf("got %v, want %v", err, tc.class)
			}
		})
	}
	// Failed starts leave no exec records behind and the sandbox works.
	ents, _ := os.ReadDir(filepath.Join(e.base, "exerr", "execs"))
	if len(ents) != 0 {
		t.Fatalf("%d exec dirs left by failed starts", len(ents))
	}
	e.mustSh("exerr", "true")
	// A FIFO planted as /etc/group does not hang execs.
	e.mustSh("exerr", "rm /etc/group && mkfifo /etc/group")
	if r := e.sh("exerr", "id -u"); r.stdout != "0\n" {
		t.Fatalf("exec with a FIFO /etc/group: %+v %q", r.ExecResult, r.stdout)
	}
	if _, _, err := e.rt.ExecResult("exerr", "../../etc"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("malformed exec id: %v", err)
	}
	if _, _, err := e.rt.ExecResult("exerr", "0123456789abcdef"); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown exec id: %v", err)
	}
	if _, err := e.rt.ExecOutput("exerr", "0123456789abcdef", "stdin"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad stream: %v", err)
	}
}

// The caller's record of an exec is kept with it, while it runs and after
// it ended; it must be one line.
func TestExecRecord(t *testing.T) {
	e := newEnv(t)
	e.create("rec")
	ctx := context.Background()
	rec := []byte(`{"who":"node","args":["sleep","30"]}`)
	x, err := e.rt.Start(ctx, "rec", runtime.Process{Args: []string{"sleep", "30"}, Record: rec}, runtime.IO{})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := e.rt.ExecState("rec", x.ID()); err != nil || string(st.Record) != string(rec) || st.Pid != x.Pid() || st.Result != nil || st.Lost {
		t.Fatalf("state while running = %+v, %v; want the record and pid %d", st, err, x.Pid())
	}
	_ = x.Signal(syscall.SIGKILL)
	res, err := x.Wait(ctx)
	if err != nil || res.Signal != "SIGKILL" {
		t.Fatalf("wait: %+v %v", res, err)
	}
	if st, err := e.rt.ExecState("rec", x.ID()); err != nil || string(st.Record) != string(rec) || st.Pid != x.Pid() || st.Result == nil || st.Result.Signal != "SIGKILL" {
		t.Fatalf("state after the end = %+v, %v; want the record, pid %d and the result", st, err, x.Pid())
	}
	if r, done, err := e.rt.ExecResult("rec", x.ID()); err != nil || !done || r.Signal != "SIGKILL" {
		t.Fatalf("result beside the record: %+v %v %v", r, done, err)
	}
	plain, err := e.run("rec", runtime.Process{Args: []string{"true"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := e.rt.ExecState("rec", plain.ExecID); err != nil || st.Record != nil {
		t.Fatalf("exec without a record: %+v, %v", st, err)
	}
	ids, err := e.rt.ListExecs("rec")
	if err != nil || len(ids) != 2 {
		t.Fatalf("listed execs %v, %v; want 2", ids, err)
	}
	if _, err := e.rt.Start(ctx, "rec", runtime.Process{Args: []string{"true"}, Record: []byte("two\nlines")}, runtime.IO{}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("record of two lines: %v", err)
	}
	if _, err := e.rt.ExecState("rec", "0123456789abcdef"); !errdefs.IsNotFound(err) {
		t.Fatalf("state of an unknown exec: %v", err)
	}
}

// An ended exec's kept output is counted, read in order across its two
// halves, and removed on request; a running exec cannot be removed.
func TestExecOutputKeptAndRemoved(t *testing.T) {
	e := newEnv(t)
	e.create("kept")
	// 3 KiB of stdout under a 2 KiB cap: the halves rotate and the tail
	// of at most the cap is kept.
	r, err := e.run("kept", runtime.Process{Args: []string{"sh", "-c", "seq 1000 | head -c 3072; echo oops >&2"}, OutputCap: 2048}, "")
	if err != nil {
		t.Fatal(err)
	}
	rc, n, err := e.rt.OpenExecOutput("kept", r.ExecID, runtime.StdoutLog)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || int64(len(b)) != n || !strings.HasSuffix(r.stdout, string(b)) || len(b) < 1024 || len(b) > 2048 {
		t.Fatalf("kept stdout: %d bytes (size %d), %v; not a tail of the %d bytes printed", len(b), n, err, len(r.stdout))
	}
	if want := n + int64(len("oops\n")); r.OutputBytes != want {
		t.Fatalf("result counts %d bytes of kept output, want %d", r.OutputBytes, want)
	}

	e2, err := e.rt.Start(context.Background(), "kept", runtime.Process{Args: []string{"sleep", "30"}}, runtime.IO{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.rt.RemoveExec("kept", e2.ID()); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("removing a running exec: %v", err)
	}
	_ = e2.Signal(syscall.SIGKILL)
	if _, err := e2.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{r.ExecID, e2.ID()} {
		if err := e.rt.RemoveExec("kept", id); err != nil {
			t.Fatalf("remove %s: %v", id, err)
		}
		if _, _, err := e.rt.OpenExecOutput("kept", id, runtime.StdoutLog); !errdefs.IsNotFound(err) {
			t.Fatalf("output of a removed exec: %v", err)
		}
		if err := e.rt.RemoveExec("kept", id); !errdefs.IsNotFound(err) {
			t.Fatalf("removing twice: %v", err)
		}
	}
	if err := e.rt.RemoveExec("kept", "../../etc"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("malformed exec id: %v", err)
	}
}

func TestExecTimeoutKillsTree(t *testing.T) {
	e := newEnv(t)
	e.create("tmo")
	t0 := time.Now()
	r, err := e.run("tmo", runtime.Process{Args: []string{"sh", "-c", "sleep 100 & sleep 100 & echo started; wait"}, Timeout: 300 * time.Millisecond}, "")
	if err != nil {
		t.Fatal(err)
	}
	if !r.TimedOut || r.Signal != "SIGKILL" || r.stdout != "started\n" {
		t.Fatalf("result %+v stdout %q", r.ExecResult, r.stdout)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("timeout took %v", d)
	}
	// The background sleeps were in the process group and died too.
	if out := e.mustSh("tmo", "ps -o comm | grep -c sleep || true"); out != "0\n" {
		t.Fatalf("sleep processes left: %q", out)
	}
}

// TestExecBackgroundChildHoldsPipes: a background process that keeps the
// output pipes open must not keep the exec from finishing.
func TestExecBackgroundChildHoldsPipes(t *testing.T) {
	e := newEnv(t)
	e.create("bgpipe")
	t0 := time.Now()
	r := e.sh("bgpipe", "sleep 30 & echo main done")
	if r.ExitCode != 0 || r.stdout != "main done\n" {
		t.Fatalf("%+v %q", r.ExecResult, r.stdout)
	}
	if d := time.Since(t0); d > 3*time.Second {
		t.Fatalf("exec waited %v for a background child", d)
	}
}

func TestSignal(t *testing.T) {
	e := newEnv(t)
	e.create("sig")
	var out bytes.Buffer
	ex, err := e.rt.Start(context.Background(), "sig", runtime.Process{Args: []string{"sh", "-c", "trap 'echo got TERM; exit 3' TERM; echo ready; while true; do sleep 0.05; done"}}, runtime.IO{Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if ex.Pid() <= 0 || ex.ID() == "" {
		t.Fatalf("pid %d id %q", ex.Pid(), ex.ID())
	}
	time.Sleep(200 * time.Millisecond)
	if err := ex.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := ex.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || !strings.Contains(out.String(), "got TERM") {
		t.Fatalf("%+v %q", res, out.String())
	}
	if err := ex.Signal(syscall.SIGTERM); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("signal after exit: %v", err)
	}
}

func TestOutputFloodIsCapped(t *testing.T) {
	e := newEnv(t)
	e.create("flood")
	const capBytes = 1 << 20
	var streamed countWriter
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := runtime.Run(ctx, e.rt, "flood", runtime.Process{Args: []string{"yes"}, Timeout: time.Second, OutputCap: capBytes}, runtime.IO{Stdout: &streamed})
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut || !res.StdoutTruncated || res.StderrTruncated || res.OutputCap != capBytes {
		t.Fatalf("result %+v", res)
	}
	kept, err := e.rt.ExecOutput("flood", res.ExecID, "stdout")
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) < capBytes/2 || len(kept) > capBytes {
		t.Fatalf("kept %d bytes, want between cap/2 and cap (%d)", len(kept), capBytes)
	}
	if strings.Trim(string(kept), "y\n") != "" {
		t.Fatalf("kept output is not yes output")
	}
	if streamed.n < int64(len(kept)) {
		t.Fatalf("streamed %d bytes, less than kept %d", streamed.n, len(kept))
	}
	e.mustSh("flood", "true")
}

type countWriter struct{ n int64 }

func (w *countWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

func TestWritesStayInUpper(t *testing.T) {
	e := newEnv(t)
	st := e.create("upper1")
	before, err := os.ReadFile(filepath.Join(lowerDir, "bin/busybox"))
	if err != nil {
		t.Fatal(err)
	}
	e.mustSh("upper1", "cp /bin/busybox /bb && rm /bin/sh && echo '#!/bb sh' > /bin/sh && echo new > /etc/newfile && rm /etc/hostname")
	after, _ := os.ReadFile(filepath.Join(lowerDir, "bin/busybox"))
	if !bytes.Equal(before, after) {
		t.Fatal("lower busybox changed")
	}
	if l, err := os.Readlink(filepath.Join(lowerDir, "bin/sh")); err != nil || l != "busybox" {
		t.Fatalf("lower /bin/sh changed: %q %v", l, err)
	}
	for _, p := range []string{"etc/newfile", "etc/hostname"} {
		_, err := os.Stat(filepath.Join(lowerDir, p))
		if (p == "etc/newfile") != os.IsNotExist(err) {
			t.Fatalf("lower %s: %v", p, err)
		}
	}
	upper, err := e.rt.UpperDir("upper1")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(upper, "bin/sh")); err != nil || string(b) != "#!/bb sh\n" {
		t.Fatalf("upper /bin/sh: %q %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(upper, "etc/newfile")); err != nil || string(b) != "new\n" {
		t.Fatalf("upper newfile: %q %v", b, err)
	}
	// The file API path sees the sandbox's view.
	root, _ := e.rt.RootFS("upper1")
	if root != fmt.Sprintf("/proc/%d/root", st.Pid) {
		t.Fatalf("rootfs %q", root)
	}
	if b, err := os.ReadFile(filepath.Join(root, "etc/newfile")); err != nil || string(b) != "new\n" {
		t.Fatalf("rootfs newfile: %q %v", b, err)
	}
	// A second sandbox on the same lower is unaffected.
	e.create("upper2")
	if out := e.mustSh("upper2", "cat /etc/hostname; test -e /etc/newfile || echo clean"); out != "rootfs\nclean\n" {
		t.Fatalf("second sandbox sees %q", out)
	}
}

func TestIsolation(t *testing.T) {
	e := newEnv(t)
	e.create("iso1")
	checks := []struct{ name, script, want string }{
		{"hostname is id", "hostname", "iso1\n"},
		{"pid 1 is the init", "cat /proc/1/cmdline | tr '\\0' ' '; echo", "init \n"},
		// The host has hundreds; busybox names re-exec'd applets "exe".
		{"only own processes", "test $(ls -d /proc/[0-9]* | wc -l) -lt 8 && echo few", "few\n"},
		{"init environ empty", "cat /proc/1/environ 2>/dev/null | wc -c", "0\n"},
		{"init fds not followable", "readlink /proc/1/fd/0 2>/dev/null || echo denied", "denied\n"},
		{"init root hidden", "ls /proc/1/root/ >/dev/null 2>&1 || echo denied", "denied\n"},
		{"init exe hidden", "readlink /proc/1/exe || echo denied", "denied\n"},
		{"timer_list masked", "wc -c < /proc/timer_list", "0\n"},
		{"kpageflags masked", "wc -c < /proc/kpageflags", "0\n"},
		{"keys masked", "cat /proc/keys | wc -c", "0\n"},
		{"sysrq-trigger read-only", "echo h > /proc/sysrq-trigger 2>/dev/null || echo denied", "denied\n"},
		{"proc/sys read-only", "echo x > /proc/sys/kernel/hostname 2>/dev/null || echo denied", "denied\n"},
		{"sys read-only", "touch /sys/x 2>/dev/null || echo denied", "denied\n"},
		// Loop devices' backing files name the host's data dir and other
		// sandboxes' IDs.
		// Root has CAP_MKNOD; the nodes it makes on the root and /dev must
		// not open (there: /dev/null's numbers, harmless if they did).
		{"mknod'd devices do not open", "mknod /n c 1 3; mknod /dev/n c 1 3; ls -l /n /dev/n | cut -c1; (echo x > /n) 2>/dev/null || echo root-denied; (echo x > /dev/n) 2>/dev/null || echo dev-denied", "c\nc\nroot-denied\ndev-denied\n"},
		{"loop devices hidden", "cat /sys/block/loop*/loop/backing_file 2>/dev/null | wc -c; ls /sys/devices/virtual/block | wc -l", "0\n0\n"},
		// Reading hot_add would allocate a zram device on the host.
		{"zram control hidden", "cat /sys/class/zram-control/hot_add 2>/dev/null | wc -c; ls /sys/class/zram-control | wc -l", "0\n0\n"},
		{"tmp writable", "echo hi > /tmp/f && cat /tmp/f", "hi\n"},
		{"dev null", "echo x > /dev/null && head -c 4 /dev/zero | wc -c", "4\n"},
		{"shm writable", "echo hi > /dev/shm/f && cat /dev/shm/f", "hi\n"},
		// /dev, /dev/shm and /tmp are directories of one tmpfs; each shows
		// only its own.
		{"tmpfs dirs apart", "touch /tmp/t /dev/shm/s; ls /tmp | grep -c -e '^s$' -e '^dev$' -e '^shm$'; ls /dev/shm | grep -c -e '^t$' -e '^null$'; ls -d /dev/tmp /dev/mask 2>/dev/null | wc -l", "0\n0\n0\n"},
		{"tmp sticky", "stat -c %a /tmp /dev/shm", "1777\n1777\n"},
		{"masked dir empty, read-only", "ls -A /sys/firmware | wc -l; touch /sys/firmware/x 2>/dev/null || echo denied", "0\ndenied\n"},
		{"ptmx", "test -c /dev/pts/ptmx && echo ok", "ok\n"},
		{"loopback only, up", "ip -o link | awk '{print $2, $3}'", "lo: <LOOPBACK,UP,LOWER_UP>\n"},
		// /sys is the node's shared sysfs of a loopback-only namespace.
		{"sys shows lo only", "ls /sys/class/net", "lo\n"},
		{"sys mount names no host path", "awk '$5 == \"/sys\" {print $4}' /proc/self/mountinfo", "/\n"},
		{"sys mount read-only", "awk '$5 == \"/sys\" {print $6}' /proc/self/mountinfo | cut -d, -f1-4", "ro,nosuid,nodev,noexec\n"},
		{"no dsec mounts", "grep -c -e dsec -e " + e.base + " /proc/self/mountinfo || true", "0\n"},
		{"no dsec env", "env | grep -c DSEC_SHIM || true", "0\n"},
		{"cannot mount", "mount -t tmpfs x /mnt 2>/dev/null || echo denied", "denied\n"},
		{"cgroup namespace", "cat /proc/self/cgroup | grep -c dsectest || true", "0\n"},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			if got := e.sh("iso1", c.script).stdout; got != c.want {
				t.Fatalf("%s: got %q want %q", c.script, got, c.want)
			}
		})
	}
}

// TestFewSuperblocks keeps the file systems each sandbox creates few: each
// new superblock costs every memory cgroup on the host kernel memory and
// makes creates and teardowns slower as sandboxes are held (see
// sharedSysfs and mask_paths in the init).
func TestFewSuperblocks(t *testing.T) {
	e := newEnv(t)
	e.create("sb1")
	e.create("sb2")
	devs := func(id string) map[string]bool {
		out := e.sh(id, "awk '{print $3}' /proc/self/mountinfo | sort -u").stdout
		m := map[string]bool{}
		for _, d := range strings.Fields(out) {
			m[d] = true
		}
		return m
	}
	a, b := devs("sb1"), devs("sb2")
	var own []string
	for d := range a {
		if !b[d] {
			own = append(own, d)
		}
	}
	// The overlay, proc, devpts and one tmpfs (/dev, /dev/shm, /tmp and
	// the masks); /sys and the device nodes are shared. (The IPC
	// namespace's mqueue is a fifth, not mounted.)
	if len(own) > 4 {
		t.Errorf("a sandbox mounts %d file systems of its own (%v), want at most 4", len(own), own)
	}
	if len(a)-len(own) < 2 {
		t.Errorf("sandboxes share %d file systems, want at least 2 (sysfs, the host's device nodes)", len(a)-len(own))
	}

	// One that will be given network devices mounts a sysfs of its own.
	e.create("sb3", func(s *runtime.Spec) { s.OwnSysfs = true })
	sysDev := func(id string) string {
		return e.mustSh(id, "awk '$5 == \"/sys\" {print $3}' /proc/self/mountinfo")
	}
	if sysDev("sb3") == sysDev("sb1") {
		t.Errorf("OwnSysfs: /sys is the shared mount (%s)", sysDev("sb3"))
	}
	if got := e.mustSh("sb3", "ls /sys/class/net; awk '$5 == \"/sys\" {print $6}' /proc/self/mountinfo | cut -d, -f1"); got != "lo\nro\n" {
		t.Errorf("OwnSysfs: got %q", got)
	}
}

func TestPauseResume(t *testing.T) {
	e := newEnv(t)
	st := e.create("pause1")
	ctx := context.Background()
	ex, err := e.rt.Start(ctx, "pause1", runtime.Process{Args: []string{"sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/c; sleep 0.02; done"}}, runtime.IO{})
	if err != nil {
		t.Fatal(err)
	}
	counter := func() int {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/root/tmp/c", st.Pid))
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	time.Sleep(200 * time.Millisecond)
	if err := e.rt.Pause(ctx, "pause1"); err != nil {
		t.Fatal(err)
	}
	c1 := counter()
	time.Sleep(300 * time.Millisecond)
	if c2 := counter(); c2 != c1 || c1 == 0 {
		t.Fatalf("counter moved while paused: %d -> %d", c1, c2)
	}
	if _, err := e.rt.Start(ctx, "pause1", runtime.Process{Args: []string{"true"}}, runtime.IO{}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("exec while paused: %v", err)
	}
	if err := e.rt.Resume(ctx, "pause1"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if c3 := counter(); c3 <= c1 {
		t.Fatalf("counter did not resume: %d -> %d", c1, c3)
	}
	_ = ex.Signal(syscall.SIGKILL)
	res, err := ex.Wait(ctx)
	if err != nil || res.Signal != "SIGKILL" {
		t.Fatalf("%+v %v", res, err)
	}
	// Destroying a paused sandbox works too.
	if err := e.rt.Pause(ctx, "pause1"); err != nil {
		t.Fatal(err)
	}
	paths := e.groupPaths(st)
	if err := e.rt.Destroy(ctx, "pause1"); err != nil {
		t.Fatal(err)
	}
	e.assertGone(st, paths)
}

// isZombie reports whether pid has exited and waits to be reaped.
func isZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && i+2 < len(b) && b[i+2] == 'Z'
}
