package misconduct

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/testutil"
	"github.com/dsec-dev/dsec/test/testenv"
	"golang.org/x/sys/unix"
)

// A fork bomb hits the sandbox's pids limit: forks fail inside, the count
// never passes the limit, and the bystander and the server do not notice.
func TestForkBomb(t *testing.T) {
	testutil.RequiresRoot(t)
	const pids = 64
	id := newSandbox(t, client.SandboxSpec{Pids: pids})
	c := admin(t)
	var peak int64
	duringAttack(t, func() {
		// The bomb runs in its own goroutine, which must not fail the test
		// itself: it hands its stderr and error over.
		type bombResult struct {
			stderr string
			err    error
		}
		done := make(chan bombResult, 1)
		go func() {
			var stderr bytes.Buffer
			_, err := c.Exec(context.Background(), client.ExecRequest{SandboxID: id, Shell: "f(){ f | f & }; f; sleep 4", Timeout: 20 * time.Second}, nil, io.Discard, &stderr)
			done <- bombResult{stderr.String(), err}
		}()
		deadline := time.After(60 * time.Second)
		for {
			select {
			case r := <-done:
				if r.err != nil {
					t.Fatalf("fork bomb exec: %v", r.err)
				}
				if !strings.Contains(r.stderr, "can't fork") && !strings.Contains(r.stderr, "Resource temporarily unavailable") {
					t.Errorf("the bomb never hit the limit: stderr %q", r.stderr[:min(len(r.stderr), 300)])
				}
				return
			case <-deadline:
				t.Fatal("fork bomb exec did not end")
			case <-time.After(200 * time.Millisecond):
				if st, err := c.Stats(context.Background(), id); err == nil && st.PidsCurrent > peak {
					peak = st.PidsCurrent
				}
			}
		}
	})
	t.Logf("peak pids %d of %d", peak, pids)
	if peak > pids {
		t.Errorf("pids reached %d, limit %d", peak, pids)
	}
	// The sandbox itself recovers once the bomb's processes die out, and
	// deleting it (the usual response) works and leaves nothing.
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := execIn(t, id, client.ExecRequest{Shell: "kill -9 -1 2>/dev/null; echo ok"})
		if r.ExitCode == 0 && strings.HasSuffix(r.stdout, "ok\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox never recovered from the fork bomb: %+v %q", r.ExecResult, r.stderr)
		}
		time.Sleep(500 * time.Millisecond)
	}
	assertHealthy(t)
}

// A memory bomb is killed inside its sandbox by the OOM killer at the
// sandbox's limit (or, when the host has swap, at twice it: swap is bounded
// by the limit too); the sandbox keeps running and reports the kill.
func TestMemoryBomb(t *testing.T) {
	testutil.RequiresRoot(t)
	id := newSandbox(t, client.SandboxSpec{MemoryBytes: 64 << 20})
	putAttack(t, id)
	var r result
	duringAttack(t, func() {
		r = execIn(t, id, client.ExecRequest{Args: []string{attackPath, "memhog", "1024"}, Timeout: time.Minute})
	})
	if r.ExitCode == 0 || r.Signal != "SIGKILL" {
		// With swap on the host, only the swap bound (memory+swap at
		// twice the limit) stops the bomb.
		swaps, _ := os.ReadFile("/proc/swaps")
		t.Errorf("memory bomb was not OOM-killed: %+v stdout %q; host swaps:\n%s", r.ExecResult, r.stdout, swaps)
	}
	st, err := admin(t).Stats(ctxT(t, 10*time.Second), id)
	if err != nil {
		t.Fatal(err)
	}
	if st.OOMKills < 1 || st.State != client.StateRunning {
		t.Errorf("after the bomb: state %s, %d OOM kills reported", st.State, st.OOMKills)
	}
	if out := sh(t, id, "echo survived"); out != "survived\n" {
		t.Errorf("sandbox after the bomb: %q", out)
	}
	assertHealthy(t)
}

// Filling the disk stops at the sandbox's disk limit (EDQUOT with btrfs
// subvolumes, ENOSPC with a loop disk), inside
// that sandbox only; the bystander still writes, and the host file system
// under the server lost at most the limit.
func TestDiskFill(t *testing.T) {
	testutil.RequiresRoot(t)
	const limit = 64 << 20
	id := newSandbox(t, client.SandboxSpec{DiskBytes: limit})
	freeBefore := hostFree(t)
	var r result
	duringAttack(t, func() {
		r = execIn(t, id, client.ExecRequest{Shell: "dd if=/dev/zero of=/workspace/fill bs=1M count=1024", Timeout: time.Minute})
	})
	if r.ExitCode == 0 || !diskFull(r.stderr) {
		t.Errorf("dd past the limit: exit %d, stderr %q", r.ExitCode, r.stderr)
	}
	size := fileSize(t, id, "/workspace/fill")
	if size > limit || size < limit/2 {
		t.Errorf("filled %d bytes with a %d limit", size, limit)
	}
	if lost := freeBefore - hostFree(t); lost > 2*limit {
		t.Errorf("host file system lost %d MiB to a %d MiB sandbox disk", lost>>20, limit>>20)
	}
	// Others are unaffected: a sandbox with its own disk writes 16 MiB.
	other := newSandbox(t, client.SandboxSpec{DiskBytes: limit})
	sh(t, other, "dd if=/dev/zero of=/workspace/f bs=1M count=16 2>/dev/null")
	if fileSize(t, other, "/workspace/f") != 16<<20 {
		t.Error("a neighbour could not write")
	}
	// The attacker recovers by deleting its file.
	sh(t, id, "rm /workspace/fill && echo ok > /workspace/after")
}

// A log-file flood (`yes` into a log) is the same attack through a
// program that never stops on its own: the log stops growing at the disk
// limit (busybox's yes then spins on ENOSPC with a long line, so the exec
// timeout ends it), and the sandbox recovers when the log goes.
func TestLogFileFlood(t *testing.T) {
	testutil.RequiresRoot(t)
	const limit = 64 << 20
	id := newSandbox(t, client.SandboxSpec{DiskBytes: limit})
	var r result
	duringAttack(t, func() {
		r = execIn(t, id, client.ExecRequest{Shell: "yes 'INFO step done, reward=0' > /workspace/train.log", Timeout: 8 * time.Second})
	})
	if r.ExitCode == 0 {
		t.Errorf("yes > log ended well: %+v", r.ExecResult)
	}
	if size := fileSize(t, id, "/workspace/train.log"); size > limit || size < limit/2 {
		t.Errorf("log grew to %d bytes, limit %d", size, limit)
	}
	if out := execIn(t, id, client.ExecRequest{Shell: "echo more >> /workspace/train.log"}); out.ExitCode == 0 {
		t.Error("a full disk took another write")
	}
	sh(t, id, "rm /workspace/train.log && echo ok > /workspace/after")
}

// Flooding stdout: the server streams what the client reads and keeps
// only a capped tail on disk; its memory stays bounded, whether the client
// reads everything or goes away.
func TestStdoutFlood(t *testing.T) {
	testutil.RequiresRoot(t)
	const outCap = 1 << 20
	id := newSandbox(t, client.SandboxSpec{})
	c := admin(t)
	rssBefore, err := testenv.RSS(suite.srv.Pid())
	if err != nil {
		t.Fatal(err)
	}

	// A client that reads everything.
	var streamed atomic.Int64
	var res *client.ExecResult
	duringAttack(t, func() {
		res, err = c.Exec(ctxT(t, time.Minute), client.ExecRequest{SandboxID: id, Args: []string{"yes"}, Timeout: 5 * time.Second, OutputCap: outCap},
			nil, countWriter{&streamed}, io.Discard)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("streamed %d MiB in 5s", streamed.Load()>>20)
	if !res.TimedOut || !res.StdoutTruncated || streamed.Load() < 4*outCap {
		t.Errorf("flood: %+v, %d bytes streamed", res, streamed.Load())
	}
	if kept := execDirSize(t, id, res.ExecID); kept > 3*outCap {
		t.Errorf("server kept %d bytes of output, cap %d", kept, outCap)
	}

	// A client that goes away after the first bytes: the exec runs on to
	// its timeout with nobody reading.
	sess, err := c.StartExec(ctxT(t, time.Minute), client.ExecRequest{SandboxID: id, Args: []string{"yes", "flood"}, Timeout: 4 * time.Second, OutputCap: outCap}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = sess.Close()
	r2, err := c.WaitExec(ctxT(t, time.Minute), id, sess.ExecID)
	if err != nil {
		t.Fatal(err)
	}
	if !r2.TimedOut {
		t.Errorf("abandoned flood: %+v", r2)
	}
	if kept := execDirSize(t, id, sess.ExecID); kept > 3*outCap {
		t.Errorf("abandoned flood: server kept %d bytes, cap %d", kept, outCap)
	}

	// The CLI, piped into head, the way a grader's script would.
	out, _, _ := suite.srv.CLI(t, "exec", "--timeout", "3s", id, "--", "sh", "-c", "yes | head -c 100000")
	if len(out) != 100000 {
		t.Errorf("CLI got %d bytes", len(out))
	}

	rssAfter, err := testenv.RSS(suite.srv.Pid())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("server RSS %d MiB -> %d MiB", rssBefore>>20, rssAfter>>20)
	if rssAfter-rssBefore > 64<<20 {
		t.Errorf("server RSS grew by %d MiB during the floods", (rssAfter-rssBefore)>>20)
	}
	assertHealthy(t)
}

type countWriter struct{ n *atomic.Int64 }

func (w countWriter) Write(p []byte) (int, error) { w.n.Add(int64(len(p))); return len(p), nil }

func fileSize(t *testing.T, id, path string) int64 {
	t.Helper()
	fi, err := admin(t).Stat(ctxT(t, 10*time.Second), id, path)
	if err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	return fi.Size
}

// hostFree is the free space of the file system holding the server's data.
func hostFree(t *testing.T) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(suite.srv.DataDir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// execDirSize sums the files the server keeps for one exec.
func execDirSize(t *testing.T, sandboxID, execID string) int64 {
	t.Helper()
	var total int64
	found := false
	_ = filepath.Walk(suite.srv.DataDir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		if fi.IsDir() && fi.Name() == execID && strings.Contains(p, sandboxID) {
			found = true
			ents, _ := os.ReadDir(p)
			for _, e := range ents {
				if info, err := e.Info(); err == nil {
					total += info.Size()
				}
			}
			return filepath.SkipAll
		}
		return nil
	})
	if !found {
		t.Fatalf("no directory for exec %s of %s under %s", execID, sandboxID, suite.srv.DataDir)
	}
	return total
}

// diskFull reports whether msg is a write refused at the disk limit.
func diskFull(msg string) bool {
	return strings.Contains(msg, "Disk quota exceeded") || strings.Contains(msg, "No space left on device")
}
