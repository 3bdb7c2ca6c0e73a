package layerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// countingProvider hands out directories and counts live references, the
// way a FUSE mounter's refcount would.
type countingProvider struct {
	mu   sync.Mutex
	refs map[blob.Digest]int
	fail error
}

func (p *countingProvider) Acquire(ctx context.Context, layer blob.Digest) (string, func(), error) {
	if p.fail != nil {
		return "", nil, p.fail
	}
	p.mu.Lock()
	p.refs[layer]++
	p.mu.Unlock()
	var once sync.Once
	return "/layers/" + string(layer), func() {
		once.Do(func() {
			p.mu.Lock()
			p.refs[layer]--
			p.mu.Unlock()
		})
	}, nil
}

func (p *countingProvider) ref(l blob.Digest) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refs[l]
}

func startDaemon(t *testing.T, p Provider) (*Daemon, *Client) {
	t.Helper()
	d := New(p, nil, nil)
	sock := filepath.Join(t.TempDir(), "layerd.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx, sock) }()
	c := NewClient(sock)
	deadline := time.Now().Add(5 * time.Second)
	for c.Ping(ctx) != nil {
		if time.Now().After(deadline) {
			t.Fatal("daemon did not come up")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		if _, err := os.Stat(sock); !os.IsNotExist(err) {
			t.Errorf("socket left behind: %v", err)
		}
	})
	return d, c
}

func TestLeases(t *testing.T) {
	p := &countingProvider{refs: map[blob.Digest]int{}}
	_, c := startDaemon(t, p)
	ctx := context.Background()
	const a, b blob.Digest = "sha256:aa", "sha256:bb"

	// Acquire is idempotent per (layer, holder).
	for i := 0; i < 3; i++ {
		path, err := c.Acquire(ctx, a, "sb-1")
		if err != nil || path != "/layers/sha256:aa" {
			t.Fatalf("acquire: %q %v", path, err)
		}
	}
	if got := p.ref(a); got != 1 {
		t.Fatalf("three acquires by one holder hold %d references, want 1", got)
	}
	for _, h := range []string{"sb-2", "sb-3"} {
		if _, err := c.Acquire(ctx, a, h); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Acquire(ctx, b, h); err != nil {
			t.Fatal(err)
		}
	}
	if p.ref(a) != 3 || p.ref(b) != 2 {
		t.Fatalf("refs a=%d b=%d, want 3 and 2", p.ref(a), p.ref(b))
	}

	// Release of one layer, then of all of a holder's layers.
	if err := c.Release(ctx, a, "sb-2"); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, a, "sb-2"); err != nil { // again: no-op
		t.Fatal(err)
	}
	if p.ref(a) != 2 || p.ref(b) != 2 {
		t.Fatalf("after release refs a=%d b=%d", p.ref(a), p.ref(b))
	}
	if err := c.Release(ctx, "", "sb-3"); err != nil {
		t.Fatal(err)
	}
	if p.ref(a) != 1 || p.ref(b) != 1 {
		t.Fatalf("after releasing sb-3 refs a=%d b=%d", p.ref(a), p.ref(b))
	}

	// A restarted server syncs the live holders: the rest are dropped.
	dropped, err := c.Sync(ctx, []string{"sb-1", "sb-9"})
	if err != nil {
		t.Fatal(err)
	}
	if dropped != 1 || p.ref(a) != 1 || p.ref(b) != 0 {
		t.Fatalf("sync dropped %d, refs a=%d b=%d", dropped, p.ref(a), p.ref(b))
	}
	holders, err := c.Holders(ctx)
	if err != nil || len(holders) != 1 || holders[0] != "sb-1" {
		t.Fatalf("holders %v %v", holders, err)
	}

	// Quit is refused while leased, allowed with force.
	if err := c.Quit(ctx, false); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("quit while leased: %v", err)
	}
}

func TestQuitWhenIdle(t *testing.T) {
	d, c := startDaemon(t, &countingProvider{refs: map[blob.Digest]int{}})
	if err := c.Quit(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("daemon did not stop")
	}
}

func TestErrors(t *testing.T) {
	p := &countingProvider{refs: map[blob.Digest]int{}, fail: fmt.Errorf("layer sha256:cc: %w", errdefs.ErrNotFound)}
	_, c := startDaemon(t, p)
	ctx := context.Background()
	if _, err := c.Acquire(ctx, "sha256:cc", "sb-1"); !errdefs.IsNotFound(err) {
		t.Fatalf("provider error class lost: %v", err)
	}
	if _, err := c.Acquire(ctx, "sha256:cc", ""); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("empty holder: %v", err)
	}
	if _, err := c.ImageStats(ctx, "x"); !errdefs.IsNotImplemented(err) {
		t.Fatalf("stats without a source: %v", err)
	}
	// A second daemon on the same socket is refused, the first keeps serving.
	sockDir := t.TempDir()
	sock := filepath.Join(sockDir, "s")
	d1 := New(p, nil, nil)
	ctx1, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = d1.Serve(ctx1, sock) }()
	c1 := NewClient(sock)
	for i := 0; c1.Ping(ctx) != nil && i < 500; i++ {
		time.Sleep(5 * time.Millisecond)
	}
	if err := New(p, nil, nil).Serve(ctx, sock); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second daemon: %v", err)
	}
	if c1.Ping(ctx) != nil {
		t.Fatal("first daemon stopped answering")
	}
	// An unreachable daemon is ErrUnavailable.
	if err := NewClient(filepath.Join(sockDir, "none")).Ping(ctx); !errdefs.IsUnavailable(err) {
		t.Fatalf("ping of nothing: %v", err)
	}
}
