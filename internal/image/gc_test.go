package image

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// readAllChunks verifies that every blob an image needs is present and
// intact.
func readAllChunks(t *testing.T, s *Store, ref string) {
	t.Helper()
	ctx := context.Background()
	im, err := s.Resolve(ctx, ref)
	must(t, err)
	for _, l := range im.Manifest.Layers {
		ix, err := ReadIndex(ctx, s.Blobs(), l.Digest)
		must(t, err)
		for _, e := range ix.Entries {
			for _, c := range e.Chunks {
				if _, err := ReadChunk(ctx, s.Blobs(), c, nil); err != nil {
					t.Fatalf("%s: %s: %v", ref, e.Path, err)
				}
			}
		}
	}
}

func layerBlobs(t *testing.T, s *Store, d blob.Digest) []blob.Digest {
	t.Helper()
	ix, err := ReadIndex(context.Background(), s.Blobs(), d)
	must(t, err)
	out := []blob.Digest{d}
	for _, e := range ix.Entries {
		for _, c := range e.Chunks {
			out = append(out, c.Blob())
		}
	}
	return out
}

func exists(s *Store, d blob.Digest) bool {
	_, err := s.Blobs().Stat(context.Background(), d)
	return err == nil
}

func TestGC(t *testing.T) {
	ctx := context.Background()
	s, bs := newTestStore(t)
	shared := tarLayer(t, []tent{{name: "shared", body: strings.Repeat("s", 300000)}})
	imgA, err := mutate.AppendLayers(empty.Image, shared, tarLayer(t, []tent{{name: "onlyA", body: string(randBytes(1, 200000))}}))
	must(t, err)
	imgB, err := mutate.AppendLayers(empty.Image, shared, tarLayer(t, []tent{{name: "onlyB", body: "b"}}))
	must(t, err)
	a, err := s.Import(ctx, "a", writeLayout(t, imgA))
	must(t, err)
	_, err = s.Import(ctx, "b", writeLayout(t, imgB))
	must(t, err)
	stray, err := bs.Put(ctx, "", strings.NewReader("unreferenced"))
	must(t, err)
	aOnly := layerBlobs(t, s, a.Manifest.Layers[1].Digest)

	// Fresh blobs are inside the default grace period: nothing goes.
	res, err := s.GC(ctx, nil)
	must(t, err)
	if res.RemovedBlobs != 0 || !exists(s, stray.Digest) {
		t.Fatalf("GC within grace period removed %d blobs", res.RemovedBlobs)
	}
	// Dry run counts without removing.
	res, err = s.GC(ctx, nil, WithGracePeriod(0), WithDryRun())
	must(t, err)
	if res.RemovedBlobs != 1 || !exists(s, stray.Digest) {
		t.Fatalf("dry run: %+v", res)
	}

	must(t, s.Remove(ctx, "a"))
	if err := s.Remove(ctx, "a"); !errdefs.IsNotFound(err) {
		t.Fatalf("second Remove: %v", err)
	}
	// A sandbox still runs image a (by manifest digest): all of it stays.
	res, err = s.GC(ctx, func() []blob.Digest { return []blob.Digest{a.Digest} }, WithGracePeriod(0))
	must(t, err)
	if res.RemovedBlobs != 1 || exists(s, stray.Digest) {
		t.Fatalf("GC with a in use: %+v", res)
	}
	for _, d := range append(aOnly, a.Digest) {
		if !exists(s, d) {
			t.Fatalf("in-use blob %s removed", d)
		}
	}
	// Only its top layer in use (e.g. a lazyfs mount): the layer and its
	// chunks stay, the manifest goes.
	_, err = s.GC(ctx, func() []blob.Digest { return []blob.Digest{a.Manifest.Layers[1].Digest} }, WithGracePeriod(0))
	must(t, err)
	for _, d := range aOnly {
		if !exists(s, d) {
			t.Fatalf("in-use layer blob %s removed", d)
		}
	}
	if exists(s, a.Digest) {
		t.Fatalf("unreferenced manifest kept")
	}
	// Nothing in use: a's own blobs go, b is intact.
	res, err = s.GC(ctx, nil, WithGracePeriod(0))
	must(t, err)
	if res.RemovedBlobs != len(aOnly) || res.FreedBytes == 0 {
		t.Fatalf("GC removed %d blobs, want %d", res.RemovedBlobs, len(aOnly))
	}
	for _, d := range aOnly {
		if exists(s, d) {
			t.Fatalf("unreferenced blob %s kept", d)
		}
	}
	readAllChunks(t, s, "b")
	if res.KeptBlobs != countBlobs(t, bs) {
		t.Fatalf("kept %d, store holds %d", res.KeptBlobs, countBlobs(t, bs))
	}
}

// TestGCDuringImports runs GCs while images are imported: no import may
// end up referencing a collected blob.
func TestGCDuringImports(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.GC(ctx, nil, WithGracePeriod(0)); err != nil {
				t.Error(err)
				return
			}
		}
	})
	for i := range 5 {
		dir := t.TempDir()
		writeFile(t, dir+"/f", randBytes(uint64(i), 3<<20), 0o644)
		writeFile(t, dir+"/same", []byte("same in all"), 0o644)
		_, err := s.Import(ctx, "img:"+string(rune('a'+i)), dir)
		must(t, err)
	}
	close(stop)
	wg.Wait()
	for i := range 5 {
		readAllChunks(t, s, "img:"+string(rune('a'+i)))
	}
}
