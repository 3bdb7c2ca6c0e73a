package lazyfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image"
	"github.com/dsec-dev/dsec/internal/testutil"
)

func entryOf(t *testing.T, idx *image.Index, p string) *image.Entry {
	t.Helper()
	for i := range idx.Entries {
		if idx.Entries[i].Path == p {
			return &idx.Entries[i]
		}
	}
	t.Fatalf("no entry %q", p)
	return nil
}

func TestLazyFetchReadsOnlyWhatIsRead(t *testing.T) {
	e := newEnv(t, nil, 1<<30)
	src := t.TempDir()
	for i := range 16 {
		writeFile(t, filepath.Join(src, fmt.Sprintf("lib/mod%02d.so", i)), randData(uint64(10+i), 2<<20), 0o644)
	}
	writeFile(t, filepath.Join(src, "lib/json/__init__.py"), []byte("import decoder\n"), 0o644)
	d, idx := buildLayer(t, e.store, src, 1<<20)
	mnt := e.acquire(t, d)

	// Listing and statting everything fetches no data.
	if err := filepath.WalkDir(mnt, func(p string, de os.DirEntry, err error) error {
		if err == nil {
			_, err = de.Info()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.m.LayerStats(d); st.FetchedBytes != 0 {
		t.Fatalf("metadata walk fetched %d bytes", st.FetchedBytes)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "lib/json/__init__.py")); err != nil || string(b) != "import decoder\n" {
		t.Fatalf("read: %q %v", b, err)
	}
	st, _ := e.m.LayerStats(d)
	if st.FetchedBytes != 15 || st.ReadBytes != 15 || st.Misses != 1 {
		t.Fatalf("reading a 15 byte file: %+v, want exactly its chunk fetched", st)
	}
	// Only that file's blob was read from the store.
	for _, ent := range idx.Entries {
		for _, c := range ent.Chunks {
			if n := e.store.readCount(blobOf(c)); (ent.Path == "lib/json/__init__.py") != (n > 0) {
				t.Errorf("%s: %d store reads", ent.Path, n)
			}
		}
	}
	// A partial read of a big file fetches only the chunk it touches.
	f, err := os.Open(filepath.Join(mnt, "lib/mod03.so"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	if _, err := f.ReadAt(buf, 1<<20+10); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, randData(13, 2<<20)[1<<20+10:1<<20+10+4096]) {
		t.Fatal("wrong bytes")
	}
	st, _ = e.m.LayerStats(d)
	if st.FetchedBytes != 15+1<<20 {
		t.Fatalf("partial read fetched %d bytes, want one 1 MiB chunk more", st.FetchedBytes-15)
	}
	if st.FetchedBytes*20 > st.ImageBytes {
		t.Fatalf("fetched %d of %d image bytes", st.FetchedBytes, st.ImageBytes)
	}
}

// Transferred bytes are what the fetches read from the store: compressed
// chunks count at their stored size, incompressible ones at their size.
func TestTransferredBytesCountStoredSize(t *testing.T) {
	e := newEnv(t, nil, 1<<30)
	src := t.TempDir()
	text := bytes.Repeat([]byte("def handler(request):\n    return json.dumps(request)\n"), 40000)
	writeFile(t, filepath.Join(src, "text.py"), text, 0o644)
	writeFile(t, filepath.Join(src, "random.bin"), randData(7, 1<<20), 0o644)
	d, idx := buildLayer(t, e.store, src, 1<<20)
	mnt := e.acquire(t, d)
	var wantFetched, wantStored int64
	for _, ent := range idx.Entries {
		for _, c := range ent.Chunks {
			wantFetched += c.Size
			wantStored += c.BlobSize()
		}
	}
	for _, name := range []string{"text.py", "random.bin"} {
		if _, err := os.ReadFile(filepath.Join(mnt, name)); err != nil {
			t.Fatal(err)
		}
	}
	st, _ := e.m.LayerStats(d)
	if st.FetchedBytes != wantFetched || st.TransferredBytes != wantStored {
		t.Fatalf("fetched %d transferred %d, want %d and %d", st.FetchedBytes, st.TransferredBytes, wantFetched, wantStored)
	}
	// The text compressed, the random MiB did not.
	if st.TransferredBytes >= st.FetchedBytes || st.TransferredBytes < 1<<20 {
		t.Fatalf("transferred %d of %d fetched bytes", st.TransferredBytes, st.FetchedBytes)
	}
}

func TestConcurrentMissesFetchOnce(t *testing.T) {
	store := newTestStore(t)
	store.delay = 100 * time.Millisecond
	e := newEnv(t, store, 1<<30)
	src := t.TempDir()
	data := randData(5, 1<<20)
	writeFile(t, filepath.Join(src, "a"), data, 0o644)
	writeFile(t, filepath.Join(src, "b"), randData(6, 1<<20), 0o644)
	d, idx := buildLayer(t, store, src, 1<<20)
	mnt := e.acquire(t, d)

	// Through FUSE: readers of different pages of one chunk.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.Open(filepath.Join(mnt, "a"))
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			off := int64(i) * 128 << 10
			buf := make([]byte, 4096)
			if _, err := f.ReadAt(buf, off); err != nil || !bytes.Equal(buf, data[off:off+4096]) {
				errs <- fmt.Errorf("reader %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := store.readCount(blobOf(entryOf(t, idx, "a").Chunks[0])); n != 1 {
		t.Fatalf("chunk read from the store %d times, want 1", n)
	}

	// Directly: 16 concurrent ReadChunk calls on a cold chunk.
	c := entryOf(t, idx, "b").Chunks[0]
	var wg2 sync.WaitGroup
	for range 16 {
		wg2.Add(1)
		go func() {
			defer wg2.Done()
			p := make([]byte, 100)
			if err := e.cache.ReadChunk(context.Background(), store, c, p, 5); err != nil {
				t.Error(err)
			}
		}()
	}
	wg2.Wait()
	if n := store.readCount(blobOf(c)); n != 1 {
		t.Fatalf("16 concurrent misses read the store %d times, want 1", n)
	}
}

func TestCorruptChunkIsEIO(t *testing.T) {
	e := newEnv(t, nil, 1<<30)
	src := t.TempDir()
	writeFile(t, filepath.Join(src, "bad"), randData(7, 300<<10), 0o644)
	writeFile(t, filepath.Join(src, "good"), []byte("fine"), 0o644)
	d, idx := buildLayer(t, e.store, src, 1<<20)
	bad := entryOf(t, idx, "bad").Chunks[0]
	e.store.set(e.store.corrupt, []blob.Digest{blobOf(bad)}, true)
	mnt := e.acquire(t, d)

	_, err := os.ReadFile(filepath.Join(mnt, "bad"))
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("reading a corrupt chunk: %v, want EIO", err)
	}
	if e.cache.Contains(bad.Digest) {
		t.Fatal("corrupt chunk was cached")
	}
	logs := e.logs.String()
	if !strings.Contains(logs, "corrupt chunk") || !strings.Contains(logs, string(bad.Digest)) || !strings.Contains(logs, string(d)) {
		t.Fatalf("log does not name the chunk and layer:\n%s", logs)
	}
	if n := e.store.readCount(blobOf(bad)); n != 1 {
		t.Fatalf("corrupt chunk read %d times; corruption is not retried", n)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "good")); err != nil || string(b) != "fine" {
		t.Fatalf("other file of the layer: %q %v", b, err)
	}
	// Once the store is repaired the same mount serves the right bytes:
	// nothing wrong was cached in the kernel or on disk.
	e.store.set(e.store.corrupt, []blob.Digest{blobOf(bad)}, false)
	time.Sleep(testMemo)
	if b, err := os.ReadFile(filepath.Join(mnt, "bad")); err != nil || !bytes.Equal(b, randData(7, 300<<10)) {
		t.Fatalf("after repair: %v", err)
	}
	if st, _ := e.m.LayerStats(d); st.FetchErrors != 1 {
		t.Fatalf("FetchErrors %d, want 1", st.FetchErrors)
	}
}

func TestStoreDownIsEIOAfterRetriesOthersServe(t *testing.T) {
	e := newEnv(t, nil, 1<<30)
	srcA, srcB := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(srcA, "f"), randData(8, 1000), 0o644)
	writeFile(t, filepath.Join(srcB, "f"), randData(9, 1000), 0o644)
	da, idxA := buildLayer(t, e.store, srcA, 1<<20)
	db, _ := buildLayer(t, e.store, srcB, 1<<20)
	ca := entryOf(t, idxA, "f").Chunks[0]
	mntA, mntB := e.acquire(t, da), e.acquire(t, db)
	e.store.set(e.store.fail, []blob.Digest{blobOf(ca)}, true)
	e.store.mu.Lock()
	e.store.delay = 50 * time.Millisecond
	e.store.mu.Unlock()

	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := os.ReadFile(filepath.Join(mntA, "f"))
		done <- err
	}()
	// While A's read retries, B keeps serving.
	if b, err := os.ReadFile(filepath.Join(mntB, "f")); err != nil || !bytes.Equal(b, randData(9, 1000)) {
		t.Fatalf("healthy layer: %v", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, syscall.EIO) {
			t.Fatalf("read with the store down: %v, want EIO", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("read with the store down did not fail in time")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("failing read took %v", took)
	}
	if n := e.store.readCount(blobOf(ca)); n != 3 {
		t.Fatalf("store tried %d times, want 3 attempts", n)
	}
	if !strings.Contains(e.logs.String(), string(ca.Digest)) {
		t.Fatal("log does not name the chunk")
	}
	// The store is back: the next read succeeds.
	e.store.set(e.store.fail, []blob.Digest{blobOf(ca)}, false)
	time.Sleep(testMemo)
	if _, err := os.ReadFile(filepath.Join(mntA, "f")); err != nil {
		t.Fatalf("after recovery: %v", err)
	}
}

func TestCacheFullStreamsAndEvicts(t *testing.T) {
	t.Run("evicts LRU", func(t *testing.T) {
		e := newEnv(t, nil, 3<<20)
		src := t.TempDir()
		for i := range 6 {
			writeFile(t, filepath.Join(src, fmt.Sprint(i)), randData(uint64(20+i), 1<<20), 0o644)
		}
		d, idx := buildLayer(t, e.store, src, 1<<20)
		mnt := e.acquire(t, d)
		for i := range 6 {
			if b, err := os.ReadFile(filepath.Join(mnt, fmt.Sprint(i))); err != nil || !bytes.Equal(b, randData(uint64(20+i), 1<<20)) {
				t.Fatalf("file %d: %v", i, err)
			}
		}
		e.cache.settle()
		cs := e.cache.Stats()
		if cs.Used > 3<<20 || cs.Evictions < 3 || cs.Uncached != 0 {
			t.Fatalf("cache after 6 MiB through a 3 MiB cache: %+v", cs)
		}
		if e.cache.Contains(entryOf(t, idx, "0").Chunks[0].Digest) || !e.cache.Contains(entryOf(t, idx, "5").Chunks[0].Digest) {
			t.Fatal("eviction is not LRU")
		}
	})
	t.Run("all pinned streams", func(t *testing.T) {
		e := newEnv(t, nil, 1<<20)
		src := t.TempDir()
		writeFile(t, filepath.Join(src, "pinned"), randData(30, 1<<20), 0o644)
		writeFile(t, filepath.Join(src, "other"), randData(31, 3<<20), 0o644)
		d, idx := buildLayer(t, e.store, src, 1<<20)
		dir, release, err := e.m.Acquire(context.Background(), d)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.ReadFile(filepath.Join(dir, "pinned")); err != nil {
			t.Fatal(err)
		}
		e.cache.settle()
		release()
		mnt := e.acquire(t, d)
		// A passthrough open pins the only cached entry: the cache is full.
		f, err := os.Open(filepath.Join(mnt, "pinned"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if cs := e.cache.Stats(); cs.Pinned != 1 || cs.Used != 1<<20 {
			t.Fatalf("cache: %+v", cs)
		}
		b, err := os.ReadFile(filepath.Join(mnt, "other"))
		if err != nil || !bytes.Equal(b, randData(31, 3<<20)) {
			t.Fatalf("read with a full cache: %v", err)
		}
		e.cache.settle()
		cs := e.cache.Stats()
		if cs.Uncached != 3 || cs.Used != 1<<20 {
			t.Fatalf("cache after streaming: %+v", cs)
		}
		for _, c := range entryOf(t, idx, "other").Chunks {
			if n := e.store.readCount(blobOf(c)); n != 1 {
				t.Fatalf("streamed chunk fetched %d times, want 1", n)
			}
		}
	})
	t.Run("bad capacity", func(t *testing.T) {
		if _, err := NewChunkCache(t.TempDir(), 0); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("capacity 0: %v", err)
		}
	})
}

func TestCacheSurvivesRestartAndVerifies(t *testing.T) {
	store := newTestStore(t)
	src := t.TempDir()
	writeFile(t, filepath.Join(src, "f"), randData(40, 1<<20), 0o644)
	_, idx := buildLayer(t, store, src, 1<<20)
	c := entryOf(t, idx, "f").Chunks[0]
	dir := t.TempDir()
	cache, err := NewChunkCache(dir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.Prefetch(context.Background(), store, c); err != nil {
		t.Fatal(err)
	}
	// Damage the cached file behind the cache's back, then reopen.
	p := filepath.Join(dir, "chunks", digestHex(c.Digest))
	b, _ := os.ReadFile(p)
	b[100] ^= 1
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &testutil.SyncBuffer{}
	cache, err = NewChunkCache(dir, 1<<30, WithCacheLogger(slog.New(slog.NewTextHandler(logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	if !cache.Contains(c.Digest) {
		t.Fatal("cached chunk forgotten across restart")
	}
	got := make([]byte, c.Size)
	if err := cache.ReadChunk(context.Background(), store, c, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, randData(40, 1<<20)) {
		t.Fatal("served a damaged cache entry")
	}
	if n := store.readCount(blobOf(c)); n != 2 {
		t.Fatalf("damaged entry was not refetched (%d store reads)", n)
	}
	if !strings.Contains(logs.String(), "dropping bad cache entry") {
		t.Fatalf("damaged cache entry not logged: %s", logs)
	}
}
