package runtime_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	dsrt "github.com/dsec-dev/dsec/internal/runtime"
)

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestNoDescriptorOrGoroutineLeak runs create/exec/destroy cycles and
// checks that the server process holds no more descriptors or goroutines
// than before.
func TestNoDescriptorOrGoroutineLeak(t *testing.T) {
	e := newEnv(t)
	cycle := func(id string) {
		e.create(id)
		e.mustSh(id, "echo x")
		if _, err := e.run(id, dsrt.Process{Args: []string{"cat"}}, "input"); err != nil {
			t.Fatal(err)
		}
		if _, err := e.run(id, dsrt.Process{Args: []string{"no-such-cmd"}}, ""); err == nil {
			t.Fatal("missing command started")
		}
		if err := e.rt.Destroy(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	cycle("leak0") // warm up lazily opened descriptors (epoll etc.)
	fds, gs := openFDs(t), runtime.NumGoroutine()
	for _, id := range []string{"leak1", "leak2", "leak3"} {
		cycle(id)
	}
	time.Sleep(100 * time.Millisecond)
	if got := openFDs(t); got != fds {
		t.Fatalf("descriptors: %d before, %d after", fds, got)
	}
	if got := runtime.NumGoroutine(); got > gs {
		t.Fatalf("goroutines: %d before, %d after", gs, got)
	}
}

func TestCreateHonoursContext(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s := e.spec("ctx1")
	if _, err := e.rt.Create(ctx, s); err == nil {
		_ = e.rt.Destroy(context.Background(), "ctx1")
		t.Fatal("create with a cancelled context succeeded")
	}
	if _, err := os.Stat(s.Dir); !os.IsNotExist(err) {
		t.Fatal("cancelled create left its dir")
	}
	// The id is free again.
	e.create("ctx1")
}

// TestConcurrentExecs runs execs in parallel in one sandbox and in several
// sandboxes; each gets its own output and result.
func TestConcurrentExecs(t *testing.T) {
	e := newEnv(t)
	e.create("conc1")
	e.create("conc2")
	errs := make(chan error, 40)
	for i := range 40 {
		go func() {
			id := []string{"conc1", "conc2"}[i%2]
			want := fmt.Sprintf("%s-%d", id, i)
			r, err := e.run(id, dsrt.Process{Args: []string{"sh", "-c", "echo $X; exit $(( $Y % 7 ))"}, Env: []string{"X=" + want, fmt.Sprintf("Y=%d", i)}}, "")
			switch {
			case err != nil:
				errs <- err
			case r.stdout != want+"\n" || r.ExitCode != i%7:
				errs <- fmt.Errorf("exec %d: %q exit %d", i, r.stdout, r.ExitCode)
			default:
				errs <- nil
			}
		}()
	}
	for range 40 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestDestroyWithRunningExecs: execs (and their shims, which live outside
// the pid namespace) do not survive or block a destroy.
func TestDestroyWithRunningExecs(t *testing.T) {
	e := newEnv(t)
	st := e.create("busy")
	var exs []dsrt.Exec
	for range 3 {
		ex, err := e.rt.Start(context.Background(), "busy", dsrt.Process{Args: []string{"sh", "-c", "sleep 30 & sleep 30"}}, dsrt.IO{Stdout: &countWriter{}})
		if err != nil {
			t.Fatal(err)
		}
		exs = append(exs, ex)
	}
	paths := e.groupPaths(st)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.rt.Destroy(ctx, "busy"); err != nil {
		t.Fatal(err)
	}
	// Each exec ends either killed (when its shim recorded that in time) or
	// with an error (its shim was killed first); none hangs.
	for _, ex := range exs {
		res, err := ex.Wait(ctx)
		if ctx.Err() != nil || (err == nil && res.Signal != "SIGKILL") {
			t.Fatalf("wait after destroy: %+v %v (ctx %v)", res, err, ctx.Err())
		}
	}
	e.assertGone(st, paths)
}
