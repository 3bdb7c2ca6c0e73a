package main

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/layerd"
)

// countingLayers is a layerd.Provider that counts how often the daemon
// takes and drops each layer (a FUSE mount's reference count).
type countingLayers struct {
	mu       sync.Mutex
	refs     map[blob.Digest]int
	acquires int
}

func (p *countingLayers) Acquire(ctx context.Context, layer blob.Digest) (string, func(), error) {
	p.mu.Lock()
	p.refs[layer]++
	p.acquires++
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

func (p *countingLayers) counts(layer blob.Digest) (refs, acquires int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refs[layer], p.acquires
}

func startLayerd(t *testing.T) (*countingLayers, *layerd.Client) {
	t.Helper()
	p := &countingLayers{refs: map[blob.Digest]int{}}
	d := layerd.New(p, nil, nil)
	sock := filepath.Join(t.TempDir(), "layerd.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx, sock) }()
	t.Cleanup(func() { cancel(); <-done })
	c := layerd.NewClient(sock)
	deadline := time.Now().Add(5 * time.Second)
	for c.Ping(ctx) != nil {
		if time.Now().After(deadline) {
			t.Fatal("layer daemon did not come up")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return p, c
}

// The daemon holds one lease per layer however many sandboxes use it,
// taken with the first and dropped with the last.
func TestLayerLeasesCountHoldersLocally(t *testing.T) {
	ctx := context.Background()
	p, c := startLayerd(t)
	l := newLayerLeases(c)
	for _, sb := range []string{"sb-1", "sb-2", "sb-3"} {
		path, err := l.Acquire(ctx, "sha256:a", sb)
		if err != nil || path != "/layers/sha256:a" {
			t.Fatalf("acquire for %s: %q %v", sb, path, err)
		}
	}
	if refs, acquires := p.counts("sha256:a"); refs != 1 || acquires != 1 {
		t.Fatalf("three holders: the daemon took the layer %d times (%d live), want once", acquires, refs)
	}
	if h, err := c.Holders(ctx); err != nil || !reflect.DeepEqual(h, []string{"layer:sha256:a"}) {
		t.Fatalf("daemon's holders %v %v", h, err)
	}
	for _, sb := range []string{"sb-1", "sb-2"} {
		if err := l.Release(ctx, "sha256:a", sb); err != nil {
			t.Fatal(err)
		}
	}
	if refs, _ := p.counts("sha256:a"); refs != 1 {
		t.Fatal("layer dropped while a sandbox still uses it")
	}
	if err := l.Release(ctx, "sha256:a", "sb-3"); err != nil {
		t.Fatal(err)
	}
	if refs, _ := p.counts("sha256:a"); refs != 0 {
		t.Fatal("layer kept after its last sandbox")
	}
	if h, _ := c.Holders(ctx); len(h) != 0 {
		t.Fatalf("daemon still lists holders %v", h)
	}
	// Used again: taken again.
	if _, err := l.Acquire(ctx, "sha256:a", "sb-4"); err != nil {
		t.Fatal(err)
	}
	if refs, acquires := p.counts("sha256:a"); refs != 1 || acquires != 2 {
		t.Fatalf("after reuse: %d live, %d acquires", refs, acquires)
	}
}

// Sync (a restart) keeps the layers of live sandboxes and drops the rest,
// also per-sandbox leases an earlier server took at the daemon.
func TestLayerLeasesSync(t *testing.T) {
	ctx := context.Background()
	p, c := startLayerd(t)
	if _, err := c.Acquire(ctx, "sha256:old", "sb-from-before"); err != nil {
		t.Fatal(err)
	}
	l := newLayerLeases(c)
	for _, a := range [][2]string{{"sha256:a", "sb-live"}, {"sha256:b", "sb-live"}, {"sha256:b", "sb-gone"}, {"sha256:c", "sb-gone"}} {
		if _, err := l.Acquire(ctx, a[0], a[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Sync(ctx, []string{"sb-live"}); err != nil {
		t.Fatal(err)
	}
	h, err := c.Holders(ctx)
	if err != nil || !reflect.DeepEqual(h, []string{"layer:sha256:a", "layer:sha256:b"}) {
		t.Fatalf("after sync the daemon holds %v (%v), want the live sandbox's two layers", h, err)
	}
	for layer, want := range map[blob.Digest]int{"sha256:a": 1, "sha256:b": 1, "sha256:c": 0, "sha256:old": 0} {
		if refs, _ := p.counts(layer); refs != want {
			t.Errorf("layer %s: %d live references, want %d", layer, refs, want)
		}
	}
	// The dropped sandbox's releases after the sync change nothing.
	if err := l.Release(ctx, "sha256:b", "sb-gone"); err != nil {
		t.Fatal(err)
	}
	if refs, _ := p.counts("sha256:b"); refs != 1 {
		t.Fatal("a late release of a dropped holder released the live sandbox's layer")
	}
}

// Creates and deletes of many sandboxes at once leave the daemon's leases
// matching what is in use.
func TestLayerLeasesConcurrent(t *testing.T) {
	ctx := context.Background()
	p, c := startLayerd(t)
	l := newLayerLeases(c)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				sb := fmt.Sprintf("sb-%d-%d", w, i)
				layer := fmt.Sprintf("sha256:%d", i%3)
				if _, err := l.Acquire(ctx, layer, sb); err != nil {
					errs <- err
					return
				}
				if err := l.Release(ctx, layer, sb); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	if _, err := l.Acquire(ctx, "sha256:1", "sb-kept"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		layer := blob.Digest(fmt.Sprintf("sha256:%d", i))
		want := 0
		if i == 1 {
			want = 1
		}
		if refs, _ := p.counts(layer); refs != want {
			t.Errorf("layer %s: %d live references, want %d", layer, refs, want)
		}
	}
	if h, _ := c.Holders(ctx); !reflect.DeepEqual(h, []string{"layer:sha256:1"}) {
		t.Fatalf("daemon holds %v", h)
	}
}
