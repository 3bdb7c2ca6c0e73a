package lazyfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image"
)

func smallLayer(t *testing.T, st blob.Store) blob.Digest {
	src := t.TempDir()
	writeFile(t, filepath.Join(src, "f"), []byte("content"), 0o644)
	d, _ := buildLayer(t, st, src, 1<<20)
	return d
}

func TestAcquireSharesOneMount(t *testing.T) {
	e := newEnv(t, nil, 1<<30)
	d := smallLayer(t, e.store)
	var wg sync.WaitGroup
	dirs := make([]string, 32)
	releases := make([]func(), 32)
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dir, rel, err := e.m.Acquire(context.Background(), d)
			if err != nil {
				t.Error(err)
				return
			}
			dirs[i], releases[i] = dir, rel
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for _, dir := range dirs {
		if dir != dirs[0] {
			t.Fatalf("mountpoints differ: %s %s", dir, dirs[0])
		}
	}
	if n := mountsUnder(t, e.root); n != 1 {
		t.Fatalf("%d mounts for one layer, want 1", n)
	}
	opts, fstype, source, super := mountEntry(t, dirs[0])
	for _, want := range []string{"ro", "allow_other", "default_permissions", "max_read=1048576"} {
		if !strings.Contains(","+opts+","+super+",", ","+want+",") {
			t.Errorf("mount options %s / %s lack %s", opts, super, want)
		}
	}
	if fstype != "fuse.dsec" || source != "dsec-layer" {
		t.Errorf("mounted as %s from %s", fstype, source)
	}
	if n := e.store.readCount(d); n != 1 {
		t.Fatalf("index read %d times, want 1", n)
	}
	for i, rel := range releases {
		rel()
		rel() // idempotent
		if want := 1; i == len(releases)-1 {
			want = 0
			if n := mountsUnder(t, e.root); n != want {
				t.Fatalf("after the last release %d mounts, want %d", n, want)
			}
		} else if n := mountsUnder(t, e.root); n != want {
			t.Fatalf("after %d releases %d mounts, want %d", i+1, n, want)
		}
	}
	if _, err := os.Stat(dirs[0]); !os.IsNotExist(err) {
		t.Fatalf("mountpoint dir left behind: %v", err)
	}
}

func TestGracePeriodAndClose(t *testing.T) {
	e := newEnv(t, nil, 1<<30, WithGracePeriod(300*time.Millisecond))
	d1, d2 := smallLayer(t, e.store), smallLayer(t, e.store)
	dir, rel, err := e.m.Acquire(context.Background(), d1)
	if err != nil {
		t.Fatal(err)
	}
	rel()
	// Re-acquired within the grace period: the same mount, not a new one.
	if _, rel2, err := e.m.Acquire(context.Background(), d1); err != nil {
		t.Fatal(err)
	} else {
		rel2()
	}
	if n := e.store.readCount(d1); n != 1 {
		t.Fatalf("remounted within the grace period (%d index reads)", n)
	}
	if n := mountsUnder(t, dir); n != 1 {
		t.Fatal("unmounted before the grace period ended")
	}
	waitFor(t, "unmount after the grace period", 5*time.Second, func() bool { return mountsUnder(t, dir) == 0 })

	// Close unmounts layers still acquired and refuses new Acquires.
	if _, _, err := e.m.Acquire(context.Background(), d1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.m.Acquire(context.Background(), d2); err != nil {
		t.Fatal(err)
	}
	if n := mountsUnder(t, e.root); n != 2 {
		t.Fatalf("%d mounts, want 2", n)
	}
	if err := e.m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := mountsUnder(t, e.root); n != 0 {
		t.Fatalf("%d mounts left after Close", n)
	}
	if _, _, err := e.m.Acquire(context.Background(), d1); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("Acquire after Close: %v", err)
	}
}

func TestCloseDetachesBusyMount(t *testing.T) {
	e := newEnv(t, nil, 1<<30)
	d := smallLayer(t, e.store)
	dir, _, err := e.m.Acquire(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := e.m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := mountsUnder(t, e.root); n != 0 {
		t.Fatalf("%d mounts left after Close with an open file", n)
	}
}

func TestAcquireBadInput(t *testing.T) {
	e := newEnv(t, nil, 1<<30)
	put := func(b []byte) blob.Digest {
		info, err := e.store.Put(context.Background(), "", strings.NewReader(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		return info.Digest
	}
	now := time.Unix(1e9, 0)
	root := image.Entry{Path: "", Type: image.TypeDir, Mode: 0o755, ModTime: now}
	idx := func(es ...image.Entry) blob.Digest {
		return putIndex(t, e.store, &image.Index{Version: image.IndexVersion, Entries: append([]image.Entry{root}, es...)})
	}
	chunk := image.Chunk{Digest: blob.FromBytes([]byte("x")), Size: 1}
	for _, tc := range []struct {
		name  string
		layer blob.Digest
		is    func(error) bool
	}{
		{"malformed digest", "sha256:nothex", errdefs.IsInvalidArgument},
		{"missing index", blob.FromBytes([]byte("nope")), errdefs.IsNotFound},
		{"not zstd", put([]byte(`{"version":1}`)), errdefs.IsInvalidArgument},
		{"wrong version", putIndex(t, e.store, &image.Index{Version: 99, Entries: []image.Entry{root}}), errdefs.IsInvalidArgument},
		{"no root", putIndex(t, e.store, &image.Index{Version: image.IndexVersion}), errdefs.IsInvalidArgument},
		{"orphan", idx(image.Entry{Path: "a/b", Type: image.TypeReg}), errdefs.IsInvalidArgument},
		{"unclean path", idx(image.Entry{Path: "../x", Type: image.TypeReg}), errdefs.IsInvalidArgument},
		{"duplicate", idx(image.Entry{Path: "a", Type: image.TypeDir}, image.Entry{Path: "a", Type: image.TypeReg}), errdefs.IsInvalidArgument},
		{"dangling hardlink", idx(image.Entry{Path: "h", Type: image.TypeHardlink, Linkname: "missing"}), errdefs.IsInvalidArgument},
		{"chunk past EOF", idx(image.Entry{Path: "f", Type: image.TypeReg, Size: 0, Chunks: []image.Chunk{chunk}}), errdefs.IsInvalidArgument},
		{"unknown type", idx(image.Entry{Path: "s", Type: "socket"}), errdefs.IsInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := e.m.Acquire(context.Background(), tc.layer)
			if err == nil || !tc.is(err) {
				t.Fatalf("Acquire: %v", err)
			}
		})
	}
	if n := mountsUnder(t, e.root); n != 0 {
		t.Fatalf("failed Acquires left %d mounts", n)
	}
	// A corrupt index blob in the store is reported, never mounted.
	d := smallLayer(t, e.store)
	e.store.set(e.store.corrupt, []blob.Digest{d}, true)
	if _, _, err := e.m.Acquire(context.Background(), d); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("corrupt index: %v", err)
	}
	e.store.set(e.store.corrupt, []blob.Digest{d}, false)
	e.acquire(t, d)
}

func TestPrefetchRecordedAndReplayed(t *testing.T) {
	store := newTestStore(t)
	src := t.TempDir()
	for i, f := range []string{"usr/lib/a.py", "usr/lib/b.py", "usr/share/unused"} {
		writeFile(t, filepath.Join(src, f), randData(uint64(60+i), 200<<10), 0o644)
	}
	writeFile(t, filepath.Join(src, "big"), randData(99, 3<<20), 0o644)
	d, idx := buildLayer(t, store, src, 1<<20)
	lists := DirPrefetchLists{Dir: t.TempDir()}

	// First sandbox: read two files, then the window closes.
	e1 := newEnv(t, store, 1<<30, WithPrefetchLists(lists), WithPrefetchWindow(300*time.Millisecond))
	mnt := e1.acquire(t, d)
	for _, f := range []string{"usr/lib/b.py", "usr/lib/a.py", "big"} {
		if _, err := os.ReadFile(filepath.Join(mnt, f)); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	waitFor(t, "prefetch list saved", 5*time.Second, func() bool {
		var err error
		got, err = lists.Load(context.Background(), d)
		return err == nil
	})
	if want := []string{"usr/lib/b.py", "usr/lib/a.py", "big"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("recorded %v, want %v", got, want)
	}
	// Reads after the window are not recorded.
	if _, err := os.ReadFile(filepath.Join(mnt, "usr/share/unused")); err != nil {
		t.Fatal(err)
	}
	if err := e1.m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, _ := lists.Load(context.Background(), d); len(got) != 3 {
		t.Fatalf("list changed after the window: %v", got)
	}

	// Later, on a node with an empty cache: mounting prefetches the list.
	e2 := newEnv(t, store, 1<<30, WithPrefetchLists(lists), WithPrefetchConcurrency(2))
	e2.acquire(t, d)
	want := 0
	for _, p := range got {
		want += len(entryOf(t, idx, p).Chunks)
	}
	waitFor(t, "prefetch", 10*time.Second, func() bool {
		n := 0
		for _, p := range got {
			for _, c := range entryOf(t, idx, p).Chunks {
				if e2.cache.Contains(c.Digest) {
					n++
				}
			}
		}
		return n == want
	})
	if c := entryOf(t, idx, "usr/share/unused").Chunks[0]; e2.cache.Contains(c.Digest) {
		t.Fatal("prefetched a file not in the list")
	}
	st, _ := e2.m.LayerStats(d)
	if st.PrefetchedBytes != 200<<10*2+3<<20 || st.ReadBytes != 0 {
		t.Fatalf("stats after prefetch: %+v", st)
	}
}

func TestStatsAndCollector(t *testing.T) {
	e := newEnv(t, nil, 1<<30)
	src := t.TempDir()
	writeFile(t, filepath.Join(src, "a"), randData(50, 1<<20), 0o644)
	writeFile(t, filepath.Join(src, "b"), randData(51, 1<<20), 0o644)
	d, _ := buildLayer(t, e.store, src, 1<<20)
	mnt := e.acquire(t, d)
	e.m.SetImage("python:3.12", []blob.Digest{d})
	if _, err := os.ReadFile(filepath.Join(mnt, "a")); err != nil {
		t.Fatal(err)
	}
	// Lower bounds only: anything on the host may read the shared mount.
	st, ok := e.m.ImageStats("python:3.12")
	if !ok || st.ImageBytes != 2<<20 || st.FetchedBytes < 1<<20 || st.ReadBytes < 1<<20 || st.Misses == 0 {
		t.Fatalf("image stats: %+v", st)
	}
	if st.FetchWait <= 0 {
		t.Fatalf("no fetch wait recorded: %+v", st)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(e.m.Collector()); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "dsec_lazyfs_image_fetched_bytes_total", "dsec_lazyfs_layer_read_bytes_total", "dsec_lazyfs_cache_used_bytes"); err != nil || n != 3 {
		t.Fatalf("gathered %d metrics: %v", n, err)
	}
	exp := `
# HELP dsec_lazyfs_image_image_bytes Sum of regular file sizes.
# TYPE dsec_lazyfs_image_image_bytes gauge
dsec_lazyfs_image_image_bytes{image="python:3.12"} 2.097152e+06
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(exp), "dsec_lazyfs_image_image_bytes"); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.m.ImageStats("unknown"); ok {
		t.Fatal("stats for an unknown image")
	}
}

func TestReleaseWhileInUse(t *testing.T) {
	e := newEnv(t, nil, 1<<30)
	src := t.TempDir()
	writeFile(t, filepath.Join(src, "a"), []byte("first"), 0o644)
	writeFile(t, filepath.Join(src, "b"), []byte("second"), 0o644)
	d, _ := buildLayer(t, e.store, src, 1<<20)

	t.Run("overlay on top", func(t *testing.T) {
		dir, release, err := e.m.Acquire(context.Background(), d)
		if err != nil {
			t.Fatal(err)
		}
		merged := mountOverlay(t, dir)
		if b, err := os.ReadFile(filepath.Join(merged, "a")); err != nil || string(b) != "first" {
			t.Fatalf("%q %v", b, err)
		}
		// A caller bug: the overlay still uses the layer. The overlay
		// holds its own clone of the mount, so the layer's mountpoint goes
		// but the daemon keeps serving the overlay.
		release()
		if n := mountsUnder(t, dir); n != 0 {
			t.Fatalf("%d mounts at the released layer", n)
		}
		if b, err := os.ReadFile(filepath.Join(merged, "b")); err != nil || string(b) != "second" {
			t.Fatalf("overlay after its layer was released: %q %v", b, err)
		}
	})
	t.Run("open file", func(t *testing.T) {
		dir, release, err := e.m.Acquire(context.Background(), d)
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(filepath.Join(dir, "a"))
		if err != nil {
			t.Fatal(err)
		}
		release()
		if n := mountsUnder(t, dir); n != 1 {
			t.Fatalf("busy layer was unmounted (%d mounts)", n)
		}
		if !strings.Contains(e.logs.String(), "unmount failed") {
			t.Fatal("failed unmount not logged")
		}
		f.Close()
		// Still usable, and the next release unmounts it.
		dir2, rel2, err := e.m.Acquire(context.Background(), d)
		if err != nil || dir2 != dir {
			t.Fatalf("re-acquire: %s %v", dir2, err)
		}
		rel2()
		if n := mountsUnder(t, dir); n != 0 {
			t.Fatalf("%d mounts after the last release", n)
		}
	})
}
