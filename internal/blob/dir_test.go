package blob_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/blob/blobtest"
)

func TestDirStoreConformance(t *testing.T) {
	blobtest.Suite(t, func(t *testing.T) blob.Store {
		s, err := blob.NewDirStore(t.TempDir(), blob.WithDirSync(true))
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestDirStoreCorruptBlob damages a blob file behind the store's back (as
// a bad disk or a writer on a shared mount could) and checks that ReadAll
// refuses it by digest.
func TestDirStoreCorruptBlob(t *testing.T) {
	root := t.TempDir()
	s, err := blob.NewDirStore(root)
	if err != nil {
		t.Fatal(err)
	}
	b := bytes.Repeat([]byte("dsec"), 1000)
	info, err := s.Put(context.Background(), "", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(root, "sha256", info.Digest.Hex()[:2], info.Digest.Hex())
	if err := os.Chmod(name, 0o644); err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(b)
	bad[1234] ^= 0xff
	if err := os.WriteFile(name, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := blob.ReadAll(context.Background(), s, info.Digest); !errors.Is(err, blob.ErrDigestMismatch) {
		t.Fatalf("ReadAll of corrupt blob: %v, want digest mismatch", err)
	}
}

// TestDirStoreSharedRoot opens two stores on one directory, as two nodes
// on a shared mount would, and checks each sees the other's blobs.
func TestDirStoreSharedRoot(t *testing.T) {
	root := t.TempDir()
	a, err := blob.NewDirStore(root)
	if err != nil {
		t.Fatal(err)
	}
	b, err := blob.NewDirStore(root)
	if err != nil {
		t.Fatal(err)
	}
	info, err := a.Put(context.Background(), "", bytes.NewReader([]byte("shared")))
	if err != nil {
		t.Fatal(err)
	}
	got, err := blob.ReadAll(context.Background(), b, info.Digest)
	if err != nil || string(got) != "shared" {
		t.Fatalf("second store: %q, %v", got, err)
	}
	ents, _ := os.ReadDir(filepath.Join(root, "tmp"))
	if len(ents) != 0 {
		t.Fatalf("%d temp files left behind", len(ents))
	}
}

func BenchmarkDirStoreReadAt(b *testing.B) {
	s, err := blob.NewDirStore(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	data := bytes.Repeat([]byte{1, 2, 3, 4}, 1<<18) // 1 MiB
	info, err := s.Put(context.Background(), "", bytes.NewReader(data))
	if err != nil {
		b.Fatal(err)
	}
	p := make([]byte, len(data))
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.ReadAt(context.Background(), info.Digest, p, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDirStorePutRefreshes: re-putting an existing blob bumps its ModTime,
// which a GC grace period relies on to spare blobs a writer reuses.
func TestDirStorePutRefreshes(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, err := blob.NewDirStore(root)
	if err != nil {
		t.Fatal(err)
	}
	b := []byte("reused chunk")
	info, err := s.Put(ctx, "", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-48 * time.Hour)
	name := filepath.Join(root, "sha256", info.Digest.Hex()[:2], info.Digest.Hex())
	if err := os.Chtimes(name, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, info.Digest, bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
	st, err := s.Stat(ctx, info.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(st.ModTime) > time.Minute {
		t.Fatalf("ModTime after re-Put = %v, not refreshed", st.ModTime)
	}
}
