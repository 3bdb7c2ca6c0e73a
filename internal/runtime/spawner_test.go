package runtime_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/runtime"
	"github.com/dsec-dev/dsec/internal/testutil"
)

// statOf returns the state and parent pid of /proc/PID/stat.
func statOf(pid int) (state byte, ppid int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	ppid, _ = strconv.Atoi(f[1])
	return f[0][0], ppid, true
}

// waitGone waits until pid has ended (gone or a zombie).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		if st, _, ok := statOf(pid); !ok || st == 'Z' {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d did not end", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// spawnerPid runs an exec so that the spawner runs, and returns its pid.
func (e *env) spawnerPid(id string) int {
	e.t.Helper()
	e.mustSh(id, "true")
	pid := runtime.SpawnerPid(e.rt)
	if pid == 0 {
		e.t.Fatal("no spawner runs after an exec")
	}
	return pid
}

// TestSpawnerKilled: a spawner killed between requests is replaced by a
// new one (not by the fork and exec fallback), and execs and creates go on.
func TestSpawnerKilled(t *testing.T) {
	e := newEnv(t)
	e.create("spk")
	for i, tc := range []struct {
		name string
		op   func(t *testing.T, i int)
	}{
		{"exec", func(t *testing.T, i int) {
			if got := e.mustSh("spk", "echo hi"); got != "hi\n" {
				t.Fatalf("exec output %q", got)
			}
		}},
		{"create", func(t *testing.T, i int) {
			id := fmt.Sprintf("spk%d", i)
			e.create(id)
			if got := e.mustSh(id, "hostname"); got != id+"\n" {
				t.Fatalf("hostname %q", got)
			}
		}},
		{"exec right after the kill", func(t *testing.T, i int) {
			// No wait for the old spawner to die: the request may reach it
			// while it is dying.
			if got := e.mustSh("spk", "echo quick"); got != "quick\n" {
				t.Fatalf("exec output %q", got)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := e.spawnerPid("spk")
			if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(tc.name, "right after") {
				waitGone(t, old)
			}
			tc.op(t, i)
			if now := runtime.SpawnerPid(e.rt); now == 0 || now == old {
				t.Fatalf("spawner pid %d after killing %d: not restarted", now, old)
			}
		})
	}
}

// TestSpawnerStopped: a spawner that does not answer is replaced after
// the request's timeout, and the request runs once.
func TestSpawnerStopped(t *testing.T) {
	defer runtime.SetSpawnTimeout(300 * time.Millisecond)()
	e := newEnv(t)
	e.create("spstop")
	old := e.spawnerPid("spstop")
	if err := syscall.Kill(old, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(old, syscall.SIGKILL)
	if got := e.mustSh("spstop", "echo x >> /tmp/count; wc -l < /tmp/count"); got != "1\n" {
		t.Fatalf("runs: %q", got)
	}
	waitGone(t, old) // killed when it was replaced
	if now := runtime.SpawnerPid(e.rt); now == 0 || now == old {
		t.Fatalf("spawner pid %d: not replaced", now)
	}
	time.Sleep(100 * time.Millisecond)
	if got := e.mustSh("spstop", "wc -l < /tmp/count"); got != "1\n" {
		t.Fatalf("runs: %q", got)
	}
}

// TestSpawnerKilledMidExec: an exec started through the spawner outlives
// it, streams its output and records its result.
func TestSpawnerKilledMidExec(t *testing.T) {
	e := newEnv(t)
	e.create("spmid")
	sp := e.spawnerPid("spmid")
	var out bytes.Buffer
	ex, err := e.rt.Start(context.Background(), "spmid", runtime.Process{Args: []string{"sh", "-c", "echo begin; sleep 1; echo end; exit 3"}},
		runtime.IO{Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(sp, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, sp)
	if _, done, err := e.rt.ExecResult("spmid", ex.ID()); done || err != nil {
		t.Fatalf("exec after the spawner died: done %v, err %v", done, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := ex.Wait(ctx)
	if err != nil || res.ExitCode != 3 {
		t.Fatalf("wait: %+v %v", res, err)
	}
	if out.String() != "begin\nend\n" {
		t.Fatalf("output %q", out.String())
	}
	if res2, done, err := e.rt.ExecResult("spmid", ex.ID()); err != nil || !done || res2.ExitCode != 3 {
		t.Fatalf("recorded result %+v %v %v", res2, done, err)
	}
}

// TestSpawnerReapsChildren: the shims it forks are its children, and it
// leaves no zombies behind.
func TestSpawnerReapsChildren(t *testing.T) {
	e := newEnv(t)
	st := e.create("spz")
	sp := e.spawnerPid("spz")
	if _, ppid, _ := statOf(st.Pid); ppid != sp {
		t.Fatalf("init's parent is %d, want the spawner %d", ppid, sp)
	}
	for range 50 {
		e.mustSh("spz", "true")
	}
	zombies := func() (n int) {
		ents, _ := os.ReadDir("/proc")
		for _, d := range ents {
			pid, err := strconv.Atoi(d.Name())
			if err != nil {
				continue
			}
			if s, ppid, ok := statOf(pid); ok && ppid == sp && s == 'Z' {
				n++
			}
		}
		return n
	}
	for deadline := time.Now().Add(2 * time.Second); zombies() > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d zombie children of the spawner", zombies())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := runtime.SpawnerPid(e.rt); got != sp {
		t.Fatalf("spawner changed from %d to %d", sp, got)
	}
}

// TestSpawnedNames: nothing of the spawner shows in the command line of
// the init (the sandbox's PID 1) or of an exec shim.
func TestSpawnedNames(t *testing.T) {
	e := newEnv(t)
	st := e.create("spn")
	read := func(pid int, file string) string {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/" + file)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	ex, err := e.rt.Start(context.Background(), "spn", runtime.Process{Args: []string{"sleep", "10"}}, runtime.IO{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ex.Signal(syscall.SIGKILL) }()
	b, err := os.ReadFile(filepath.Join(e.base, "spn", "execs", ex.ID(), "result.json.tmp"))
	if err != nil {
		t.Fatal(err)
	}
	var shimPid int
	var start uint64
	if _, err := fmt.Sscanf(string(b), "running %d %d", &shimPid, &start); err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	for _, tc := range []struct {
		name, got, want string
	}{
		{"init cmdline", read(st.Pid, "cmdline"), "init\x00"},
		{"init comm", read(st.Pid, "comm"), "init\n"},
		{"pid 1 cmdline inside", e.mustSh("spn", "od -An -c /proc/1/cmdline | tr -s ' '"), " i n i t \\0\n"},
		{"exec shim cmdline", read(shimPid, "cmdline"), "exec\x00"},
		{"exec shim comm", read(shimPid, "comm"), "dsec-exec\n"},
		{"spawner comm", read(runtime.SpawnerPid(e.rt), "comm"), "dsec-spawner\n"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, tc.got, tc.want)
		}
	}
}

// TestSpawnerEndsWithRuntime: Close ends the spawner; the sandboxes and
// execs it started run on and are adopted by the next runtime.
func TestSpawnerEndsWithRuntime(t *testing.T) {
	e := newEnv(t)
	rt1, err := runtime.NewNamespaceRuntime(e.cg, runtime.WithCgroupParent(e.parent))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := rt1.Create(ctx, e.spec("spend"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.rt.Destroy(context.Background(), "spend") })
	ex, err := rt1.Start(ctx, "spend", runtime.Process{Args: []string{"sh", "-c", "sleep 0.5; exit 5"}}, runtime.IO{})
	if err != nil {
		t.Fatal(err)
	}
	sp := runtime.SpawnerPid(rt1)
	if sp == 0 {
		t.Fatal("no spawner")
	}
	if err := rt1.Close(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, sp)
	if err := e.rt.Adopt(ctx, *st); err != nil {
		t.Fatal(err)
	}
	if res, err := ex.Wait(ctx); err != nil || res.ExitCode != 5 {
		t.Fatalf("exec across Close: %+v %v", res, err)
	}
	if got := e.mustSh("spend", "echo after"); got != "after\n" {
		t.Fatalf("%q", got)
	}
}

func TestSpawnerFallback(t *testing.T) {
	for _, tc := range []struct{ name, path string }{
		{"cannot start", "/nonexistent/dsec"},
		// Starts, but exits at once ("false" knows no spawner mode).
		{"exits at once", "/bin/false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs testutil.SyncBuffer
			e := newEnv(t, runtime.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
			runtime.SetSpawnerPath(e.rt, tc.path)
			id := "spfb" + strconv.Itoa(len(tc.path))
			e.create(id)
			for range 3 {
				if got := e.mustSh(id, "echo ok"); got != "ok\n" {
					t.Fatalf("%q", got)
				}
			}
			st := e.create(id + "b")
			if b, _ := os.ReadFile("/proc/" + strconv.Itoa(st.Pid) + "/cmdline"); string(b) != "init\x00" {
				t.Errorf("init cmdline %q", b)
			}
			if pid := runtime.SpawnerPid(e.rt); pid != 0 {
				t.Errorf("spawner pid %d, want none", pid)
			}
			n := 0
			for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
				var rec struct{ Level, Msg string }
				if json.Unmarshal([]byte(l), &rec) == nil && strings.Contains(rec.Msg, "fork and exec") {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("%d fallback warnings, want 1:\n%s", n, logs.String())
			}
		})
	}
}

// TestSpawnerDiesBeforeReply: a spawner that dies between a clone and its
// reply leaves a child that never runs (it waits for the reply to have
// been sent), so the request is repeated on a new spawner and runs once.
func TestSpawnerDiesBeforeReply(t *testing.T) {
	e := newEnv(t)
	flag := filepath.Join(e.base, "die")
	runtime.SetSpawnerDieFlag(e.rt, flag)
	e.create("spdie")
	old := e.spawnerPid("spdie")
	if err := os.WriteFile(flag, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := e.mustSh("spdie", "echo x >> /tmp/count; wc -l < /tmp/count"); got != "1\n" {
		t.Fatalf("runs: %q", got)
	}
	if _, err := os.Stat(flag); !os.IsNotExist(err) {
		t.Fatalf("the spawner did not die: %v", err)
	}
	if now := runtime.SpawnerPid(e.rt); now == 0 || now == old {
		t.Fatalf("spawner pid %d after %d died: not restarted", now, old)
	}
	time.Sleep(200 * time.Millisecond)
	if got := e.mustSh("spdie", "wc -l < /tmp/count"); got != "1\n" {
		t.Fatalf("runs: %q", got)
	}
	// The orphaned child (still named after the spawner) has exited.
	for deadline := time.Now().Add(2 * time.Second); ; {
		orphans := orphanedSpawnerChildren(flag)
		if len(orphans) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("children of dead spawners still run: %v", orphans)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A create through the same path.
	if err := os.WriteFile(flag, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	e.create("spdie2")
	if _, err := os.Stat(flag); !os.IsNotExist(err) {
		t.Fatalf("the spawner did not die: %v", err)
	}
	if got := e.mustSh("spdie2", "hostname"); got != "spdie2\n" {
		t.Fatalf("%q", got)
	}
}

// orphanedSpawnerChildren lists the processes that inherited the
// environment of this test's spawners (with the die flag) and are not
// children of this process: children of a dead spawner that outlived it.
// (Inits wipe their environment and are not dumpable.)
func orphanedSpawnerChildren(flag string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile("/proc/" + d.Name() + "/environ")
		if err != nil || !bytes.Contains(env, []byte("_DSEC_SPAWNER_TEST_DIE="+flag+"\x00")) {
			continue
		}
		if st, ppid, ok := statOf(pid); ok && st != 'Z' && ppid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestSpawnedSignals: what the server ignores (here SIGHUP, as under
// nohup) is not ignored in a sandbox, and nothing is blocked: a child of
// the spawner resets every disposition and its mask.
func TestSpawnedSignals(t *testing.T) {
	signal.Ignore(syscall.SIGHUP)
	defer signal.Reset(syscall.SIGHUP)
	e := newEnv(t)
	st := e.create("spsig")
	// grep reads its own status (a shell would ignore SIGQUIT itself).
	r, err := e.run("spsig", runtime.Process{Args: []string{"grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n"; r.stdout != want {
		t.Errorf("exec'd process: %q, want %q", r.stdout, want)
	}
	if got := procStatus(t, st.Pid, "SigIgn"); got != "0000000000000000" {
		t.Errorf("init SigIgn %s", got)
	}
}

func procStatus(t *testing.T, pid int, key string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %s in /proc/%d/status", key, pid)
	return ""
}
