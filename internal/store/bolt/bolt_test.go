package bolt

import (
	"context"
	"path/filepath"
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
