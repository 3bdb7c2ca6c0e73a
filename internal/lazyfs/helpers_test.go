package lazyfs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image"
	"github.com/dsec-dev/dsec/internal/testutil"
)

// testStore wraps a DirStore to count reads and inject failures.
type testStore struct {
	blob.Store
	mu      sync.Mutex
	reads   map[blob.Digest]int   // ReadAt calls
	bytes   map[blob.Digest]int64 // bytes returned
	fail    map[blob.Digest]bool  // ReadAt fails with ErrUnavailable
	corrupt map[blob.Digest]bool  // ReadAt returns flipped bytes
	delay   time.Duration
}

func newTestStore(t testing.TB) *testStore {
	s, err := blob.NewDirStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &testStore{Store: s, reads: map[blob.Digest]int{}, bytes: map[blob.Digest]int64{},
		fail: map[blob.Digest]bool{}, corrupt: map[blob.Digest]bool{}}
}

func (s *testStore) ReadAt(ctx context.Context, d blob.Digest, p []byte, off int64) (int, error) {
	s.mu.Lock()
	s.reads[d]++
	fail, corrupt, delay := s.fail[d], s.corrupt[d], s.delay
	s.mu.Unlock()
	if delay > 0 {
		time.Sleep(delay)
	}
	if fail {
		return 0, fmt.Errorf("test store down: %w", errdefs.ErrUnavailable)
	}
	n, err := s.Store.ReadAt(ctx, d, p, off)
	if corrupt && n > 0 {
		p[0] ^= 0xff
	}
	s.mu.Lock()
	s.bytes[d] += int64(n)
	s.mu.Unlock()
	return n, err
}

func (s *testStore) readCount(d blob.Digest) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads[d]
}

func (s *testStore) set(m map[blob.Digest]bool, ds []blob.Digest, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range ds {
		m[d] = on
	}
}

// blobOf is the blob a chunk is read from.
func blobOf(c image.Chunk) blob.Digest {
	if c.Stored != "" {
		return c.Stored
	}
	return c.Digest
}

// buildLayer walks dir and stores it as a layer (index + chunks) in the
// storage format of internal/image: all-zero chunks are holes, every other
// chunk is compressed when that saves space.
func buildLayer(t testing.TB, st blob.Store, dir string, chunkSize int) (blob.Digest, *image.Index) {
	t.Helper()
	ctx := context.Background()
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	put := func(b []byte) blob.Digest {
		info, err := st.Put(ctx, "", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		return info.Digest
	}
	idx := &image.Index{Version: image.IndexVersion}
	links := map[[2]uint64]string{}
	nchunk := 0
	err = filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			rel = ""
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		sys := fi.Sys().(*syscall.Stat_t)
		e := image.Entry{Path: rel, Mode: fi.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky),
			UID: int(sys.Uid), GID: int(sys.Gid), ModTime: fi.ModTime(), Xattrs: readXattrs(t, p)}
		switch m := fi.Mode(); {
		case m.IsDir():
			e.Type = image.TypeDir
		case m&os.ModeSymlink != 0:
			e.Type = image.TypeSymlink
			e.Linkname, _ = os.Readlink(p)
		case m&os.ModeCharDevice != 0:
			e.Type = image.TypeChar
		case m&os.ModeDevice != 0:
			e.Type = image.TypeBlock
		case m&os.ModeNamedPipe != 0:
			e.Type = image.TypeFifo
		case m.IsRegular():
			key := [2]uint64{sys.Dev, sys.Ino}
			if target, ok := links[key]; ok && sys.Nlink > 1 {
				e.Type, e.Linkname = image.TypeHardlink, target
				break
			}
			links[key] = rel
			e.Type, e.Size = image.TypeReg, fi.Size()
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for off := 0; off < len(data); off += chunkSize {
				b := data[off:min(off+chunkSize, len(data))]
				if bytes.Count(b, []byte{0}) == len(b) {
					continue
				}
				c := image.Chunk{Offset: int64(off), Size: int64(len(b)), Digest: blob.FromBytes(b)}
				nchunk++
				if z := enc.EncodeAll(b, nil); nchunk%2 == 0 && len(z) < len(b) {
					c.Stored = put(z)
				} else {
					put(b)
				}
				e.Chunks = append(e.Chunks, c)
			}
			idx.Size += e.Size
		}
		if e.Type == image.TypeChar || e.Type == image.TypeBlock {
			e.Devmajor, e.Devminor = int64(unix.Major(uint64(sys.Rdev))), int64(unix.Minor(uint64(sys.Rdev)))
		}
		idx.Entries = append(idx.Entries, e)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return putIndex(t, st, idx), idx
}

func putIndex(t testing.TB, st blob.Store, idx *image.Index) blob.Digest {
	t.Helper()
	raw, err := json.Marshal(idx)
	if err != nil {
		t.Fatal(err)
	}
	enc, _ := zstd.NewWriter(nil)
	defer enc.Close()
	info, err := st.Put(context.Background(), "", bytes.NewReader(enc.EncodeAll(raw, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return info.Digest
}

func readXattrs(t testing.TB, p string) map[string][]byte {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if err != nil || n == 0 {
		return nil
	}
	out := map[string][]byte{}
	for _, name := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
		v := make([]byte, 64<<10)
		m, err := unix.Lgetxattr(p, name, v)
		if err != nil {
			t.Fatalf("getxattr %s %s: %v", p, name, err)
		}
		out[name] = v[:m]
	}
	return out
}

// testMemo is how long tests' caches remember a failed fetch.
const testMemo = 300 * time.Millisecond

// env is a mounter with its cache and store for one test.
type env struct {
	store *testStore
	cache *ChunkCache
	m     *Mounter
	root  string
	logs  *testutil.SyncBuffer
}

func newEnv(t testing.TB, store *testStore, capacity int64, mopts ...Opt) *env {
	t.Helper()
	testutil.RequiresRoot(t)
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testutil.RequiresFeature(t, "/dev/fuse", false)
	}
	if store == nil {
		store = newTestStore(t)
	}
	logs := &testutil.SyncBuffer{}
	log := slog.New(slog.NewTextHandler(io.MultiWriter(logs, testWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	cache, err := NewChunkCache(t.TempDir(), capacity, WithCacheLogger(log), WithRetry(3, 10*time.Millisecond), WithFailureMemo(testMemo))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	m, err := NewMounter(root, store, cache, append([]Opt{WithLogger(log), WithGracePeriod(0)}, mopts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(context.Background()); err != nil {
			t.Errorf("close mounter: %v", err)
		}
		if n := mountsUnder(t, root); n != 0 {
			t.Errorf("%d mounts left under %s", n, root)
		}
	})
	return &env{store: store, cache: cache, m: m, root: root, logs: logs}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	if testing.Verbose() {
		w.t.Logf("%s", bytes.TrimRight(p, "\n"))
	}
	return len(p), nil
}

func (e *env) acquire(t testing.TB, d blob.Digest) string {
	t.Helper()
	dir, release, err := e.m.Acquire(context.Background(), d)
	if err != nil {
		t.Fatalf("acquire %s: %v", d, err)
	}
	t.Cleanup(release)
	return dir
}

// mountsUnder counts mounts at or below dir in /proc/self/mountinfo.
func mountsUnder(t testing.TB, dir string) int {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			n++
		}
	}
	return n
}

// mountOverlay mounts an overlay with a fresh upper over lowers (top first).
func mountOverlay(t testing.TB, lowers ...string) string {
	t.Helper()
	base := t.TempDir()
	upper, work, merged := filepath.Join(base, "upper"), filepath.Join(base, "work"), filepath.Join(base, "merged")
	for _, d := range []string{upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(lowers, ":"), upper, work)
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Fatalf("mount overlay %s: %v", opts, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(merged, 0); err != nil && err != unix.EINVAL {
			t.Errorf("unmount overlay: %v", err)
		}
	})
	return merged
}

func writeFile(t testing.TB, p string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, mode); err != nil {
		t.Fatal(err)
	}
}

// randData returns n deterministic incompressible-ish bytes.
func randData(seed uint64, n int) []byte {
	b := make([]byte, n)
	x := seed*0x9E3779B97F4A7C15 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
	return b
}

func waitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// mountEntry returns the mountinfo fields of the mount at dir: mount
// options, fs type, source and super options.
func mountEntry(t testing.TB, dir string) (opts, fstype, source, super string) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 10 || f[4] != dir {
			continue
		}
		i := 6
		for f[i] != "-" {
			i++
		}
		return f[5], f[i+1], f[i+2], f[i+3]
	}
	t.Fatalf("%s is not mounted", dir)
	return
}
