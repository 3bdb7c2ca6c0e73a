package bolt

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/store"
	"github.com/dsec-dev/dsec/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := Open(filepath.Join(t.TempDir(), DefaultFile), WithNoSync())
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestPersistsAcrossReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "sub", DefaultFile)
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "b", "k", map[string]int{"n": 7}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var got map[string]int
	if err := s.Get(ctx, "b", "k", &got); err != nil || got["n"] != 7 {
		t.Fatalf("after reopen: %v %v", got, err)
	}
}

func TestSecondOpenIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), DefaultFile)
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = Open(path, WithLockTimeout(50*time.Millisecond))
	if !errdefs.IsUnavailable(err) {
		t.Fatalf("want unavailable while locked, got %v", err)
	}
}

// Updates queued behind a commit in flight are committed together, and
// one that fails there fails alone: its writes (made in the shared
// transaction) are not seen by the others and do not land.
func TestGroupCommitIsolatesFailures(t *testing.T) {
	ctx := context.Background()
	s, err := Open(filepath.Join(t.TempDir(), DefaultFile), WithNoSync())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	release, first := holdCommitter(t, s)
	boom := errors.New("boom")
	const n = 6
	results := make([]chan error, n)
	for i := range results {
		results[i] = make(chan error, 1)
		go func() {
			results[i] <- s.Update(ctx, func(tx store.Tx) error {
				if err := tx.Put(ctx, "b", fmt.Sprint("k", i), i); err != nil {
					return err
				}
				var seen int
				if i > 0 && tx.Get(ctx, "b", fmt.Sprint("k", i-1), &seen) == nil && i-1 == 2 {
					return fmt.Errorf("update %d sees the write of the failed update 2", i)
				}
				if i == 2 {
					return boom
				}
				return nil
			})
		}()
	}
	waitQueued(t, s, n)
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for i, r := range results {
		err := <-r
		var got int
		gerr := s.Get(ctx, "b", fmt.Sprint("k", i), &got)
		switch {
		case i == 2:
			if !errors.Is(err, boom) || !errdefs.IsNotFound(gerr) {
				t.Fatalf("failing update: err %v, its write %v", err, gerr)
			}
		case err != nil || gerr != nil || got != i:
			t.Fatalf("update %d: %v; its write: %d %v", i, err, got, gerr)
		}
	}
}

// holdCommitter has the committer run an update that waits for release
// (also called when the test ends), so that the next updates queue.
func holdCommitter(t *testing.T, s *Store) (release func(), result chan error) {
	t.Helper()
	started, hold := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release)
	result = make(chan error, 1)
	go func() {
		result <- s.Update(context.Background(), func(tx store.Tx) error {
			close(started)
			<-hold
			return tx.Put(context.Background(), "b", "held", 1)
		})
	}()
	<-started
	return release, result
}

func waitQueued(t *testing.T, s *Store, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		q := len(s.queue)
		s.mu.Unlock()
		if q == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d updates queued, want %d", q, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Close commits what is queued; later updates are refused.
func TestCloseCommitsQueued(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), DefaultFile)
	s, err := Open(path, WithNoSync())
	if err != nil {
		t.Fatal(err)
	}
	release, held := holdCommitter(t, s)
	queued := make(chan error, 1)
	go func() { queued <- s.Put(ctx, "b", "b", 2) }()
	waitQueued(t, s, 1)
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	release()
	for _, c := range []chan error{held, queued} {
		if err := <-c; err != nil {
			t.Fatal(err)
		}
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "b", "c", 3); err == nil {
		t.Fatal("put after close succeeded")
	}
	s, err = Open(path, WithNoSync())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var a, b int
	if s.Get(ctx, "b", "held", &a) != nil || s.Get(ctx, "b", "b", &b) != nil || a != 1 || b != 2 {
		t.Fatalf("after close and reopen: a=%d b=%d", a, b)
	}
}
