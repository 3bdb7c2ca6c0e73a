package runtime_test

import (
	"context"
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
