package lazyfs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/image"
)

// makeTree builds a source tree with every entry type and attribute the
// index carries.
func makeTree(t *testing.T) string {
	t.Helper()
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(src, "empty"), nil, 0o644)
	writeFile(t, filepath.Join(src, "small.txt"), []byte("hello lazyfs\n"), 0o640)
	writeFile(t, filepath.Join(src, "dir/big.bin"), randData(1, 3<<20+12345), 0o755)
	writeFile(t, filepath.Join(src, "dir/sub/zeros"), make([]byte, 2<<20), 0o600)
	// Sparse: holes around one data block in the middle.
	sp := filepath.Join(src, "sparse")
	writeFile(t, sp, nil, 0o644)
	f, err := os.OpenFile(sp, os.O_WRONLY, 0)
	must(err)
	_, err = f.WriteAt(randData(2, 1000), 5<<20+77)
	must(err)
	must(f.Truncate(9 << 20))
	must(f.Close())

	suid := filepath.Join(src, "bin/suid")
	writeFile(t, suid, []byte("#!/bin/sh\n"), 0o755)
	must(os.Chown(suid, 1234, 5678))
	must(os.Chmod(suid, 0o755|os.ModeSetuid|os.ModeSetgid))
	sticky := filepath.Join(src, "tmp")
	must(os.Mkdir(sticky, 0o777))
	must(os.Chmod(sticky, 0o777|os.ModeSticky))
	must(os.Symlink("../small.txt", filepath.Join(src, "dir/link")))
	must(os.Symlink("/nonexistent/abs", filepath.Join(src, "abslink")))
	must(os.Link(filepath.Join(src, "small.txt"), filepath.Join(src, "dir/hard1")))
	must(os.Link(filepath.Join(src, "small.txt"), filepath.Join(src, "hard2")))
	must(unix.Mknod(filepath.Join(src, "whiteout"), unix.S_IFCHR, 0))
	must(unix.Mknod(filepath.Join(src, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(unix.Mknod(filepath.Join(src, "loop9"), unix.S_IFBLK|0o660, int(unix.Mkdev(7, 9))))
	must(unix.Mkfifo(filepath.Join(src, "fifo"), 0o600))
	opaque := filepath.Join(src, "opaque")
	writeFile(t, filepath.Join(opaque, "kept"), []byte("kept"), 0o644)
	must(unix.Setxattr(opaque, "trusted.overlay.opaque", []byte("y"), 0))
	must(unix.Setxattr(filepath.Join(src, "small.txt"), "user.note", []byte("a note"), 0))
	must(unix.Setxattr(filepath.Join(src, "small.txt"), "trusted.custom", []byte{0, 1, 2}, 0))
	// A valid VFS_CAP_REVISION_2 blob granting cap_net_bind_service.
	capv := make([]byte, 20)
	binary.LittleEndian.PutUint32(capv[0:], 0x02000000|1)
	binary.LittleEndian.PutUint32(capv[4:], 1<<10)
	must(unix.Setxattr(suid, "security.capability", capv, 0))
	must(os.Chown(filepath.Join(src, "dir"), 42, 43))
	old := time.Date(2001, 2, 3, 4, 5, 6, 789, time.UTC)
	must(os.Chtimes(filepath.Join(src, "dir/big.bin"), old, old))
	must(unix.Lutimes(filepath.Join(src, "abslink"), []unix.Timeval{{Sec: 1e9}, {Sec: 1e9}}))
	return src
}

type attrs struct {
	Mode     uint32
	UID, GID uint32
	Size     int64
	Rdev     uint64
	Nlink    uint64
	Mtime    int64
	Link     string
	Xattrs   map[string][]byte
	Data     []byte
}

func attrsOf(t *testing.T, p string) attrs {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatalf("lstat %s: %v", p, err)
	}
	a := attrs{Mode: st.Mode, UID: st.Uid, GID: st.Gid, Rdev: st.Rdev, Nlink: st.Nlink,
		Mtime: st.Mtim.Nano(), Xattrs: readXattrs(t, p)}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		a.Size = st.Size
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		a.Data = data
	case unix.S_IFLNK:
		a.Size = st.Size
		a.Link, _ = os.Readlink(p)
	}
	return a
}

func TestMountMatchesSourceTree(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(t *testing.T, st blob.Store, src string) blob.Digest
	}{
		{"test builder", func(t *testing.T, st blob.Store, src string) blob.Digest {
			d, _ := buildLayer(t, st, src, 1<<20)
			return d
		}},
		{"image.BuildLayer", func(t *testing.T, st blob.Store, src string) blob.Digest {
			// Its default policy drops device nodes other than whiteouts.
			for _, dev := range []string{"null", "loop9"} {
				if err := os.Remove(filepath.Join(src, dev)); err != nil {
					t.Fatal(err)
				}
			}
			d, _, err := image.BuildLayer(context.Background(), st, src)
			if err != nil {
				t.Fatal(err)
			}
			return d
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil, 1<<30)
			src := makeTree(t)
			testMountMatches(t, e, src, tc.build(t, e.store, src))
		})
	}
}

func testMountMatches(t *testing.T, e *env, src string, d blob.Digest) {
	mnt := e.acquire(t, d)
	if strings.Contains(mnt, ":") {
		t.Fatalf("mountpoint %q has a ':' and cannot be an overlay lowerdir", mnt)
	}
	seen := 0
	err := filepath.WalkDir(src, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		want, got := attrsOf(t, p), attrsOf(t, filepath.Join(mnt, rel))
		if rel == "." {
			// The mountpoint's root is the layer root.
			want.Nlink = got.Nlink
		}
		if !reflect.DeepEqual(want, got) {
			t.Errorf("%s:\nsource %+v\nmount  %+v", rel, short(want), short(got))
		}
		seen++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen < 18 {
		t.Fatalf("walked only %d entries", seen)
	}
	// Hardlinks are one inode.
	var a, b, c unix.Stat_t
	for p, st := range map[string]*unix.Stat_t{"small.txt": &a, "dir/hard1": &b, "hard2": &c} {
		if err := unix.Lstat(filepath.Join(mnt, p), st); err != nil {
			t.Fatal(err)
		}
	}
	if a.Ino != b.Ino || a.Ino != c.Ino || a.Nlink != 3 {
		t.Fatalf("hardlinks: inos %d %d %d nlink %d, want one inode with nlink 3", a.Ino, b.Ino, c.Ino, a.Nlink)
	}
	// The mount is read-only.
	if err := os.WriteFile(filepath.Join(mnt, "new"), nil, 0o644); err == nil || !(os.IsPermission(err) || strings.Contains(err.Error(), "read-only")) {
		t.Fatalf("write to the layer: %v, want a read-only error", err)
	}
	// Holes and all-zero blocks cost nothing in the store.
	st, _ := e.m.LayerStats(d)
	if want := int64(3<<20 + 12345 + 13 + 10 + 4 + 9<<20 + 2<<20); st.ImageBytes != want {
		t.Fatalf("ImageBytes %d, want %d", st.ImageBytes, want)
	}
}

// short hides file bodies in failure output.
func short(a attrs) attrs {
	if len(a.Data) > 32 {
		a.Data = append(a.Data[:32:32], []byte("...")...)
	}
	return a
}

func TestOverlayOnLayers(t *testing.T) {
	e := newEnv(t, nil, 1<<30)
	lower := t.TempDir()
	writeFile(t, filepath.Join(lower, "etc/passwd"), []byte("root:x:0:0\n"), 0o644)
	writeFile(t, filepath.Join(lower, "etc/gone"), []byte("deleted above"), 0o644)
	writeFile(t, filepath.Join(lower, "app/old1"), []byte("old"), 0o644)
	writeFile(t, filepath.Join(lower, "app/old2"), []byte("old"), 0o644)
	top := t.TempDir()
	if err := os.MkdirAll(filepath.Join(top, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(top, "etc/gone"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(top, "app/new"), []byte("new"), 0o644)
	if err := unix.Setxattr(filepath.Join(top, "app"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	dl, _ := buildLayer(t, e.store, lower, 1<<20)
	dt, _ := buildLayer(t, e.store, top, 1<<20)
	merged := mountOverlay(t, e.acquire(t, dt), e.acquire(t, dl))

	if b, err := os.ReadFile(filepath.Join(merged, "etc/passwd")); err != nil || string(b) != "root:x:0:0\n" {
		t.Fatalf("lower file through overlay: %q %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(merged, "etc/gone")); !os.IsNotExist(err) {
		t.Fatalf("whiteout did not hide etc/gone: %v", err)
	}
	ents, err := os.ReadDir(filepath.Join(merged, "app"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range ents {
		names = append(names, de.Name())
	}
	if !reflect.DeepEqual(names, []string{"new"}) {
		t.Fatalf("opaque dir lists %v, want [new]", names)
	}
	// The upper is private and writable; the layer is untouched.
	writeFile(t, filepath.Join(merged, "etc/passwd"), []byte("changed"), 0o644)
	if b, _ := os.ReadFile(filepath.Join(e.m.Mountpoint(dl), "etc/passwd")); string(b) != "root:x:0:0\n" {
		t.Fatalf("layer changed under the overlay: %q", b)
	}
}

// residentPages counts the pages of p in the page cache (fincore).
func residentPages(t testing.TB, p string) (resident, total int) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	mem, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	page := os.Getpagesize()
	vec := make([]byte, (len(mem)+page-1)/page)
	if _, _, errno := syscall.Syscall(syscall.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	for _, v := range vec {
		resident += int(v & 1)
	}
	return resident, len(vec)
}

func meminfoCached(t testing.TB) int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		var kb int64
		if n, _ := fmt.Sscanf(l, "Cached: %d kB", &kb); n == 1 {
			return kb << 10
		}
	}
	t.Fatal("no Cached in /proc/meminfo")
	return 0
}

func TestPageCacheSharedAcrossOverlays(t *testing.T) {
	e := newEnv(t, nil, 1<<30)
	src := t.TempDir()
	const size = 48 << 20
	data := randData(3, size)
	writeFile(t, filepath.Join(src, "big"), data, 0o644)
	d, _ := buildLayer(t, e.store, src, 1<<20)
	layer := e.acquire(t, d)
	o1, o2 := mountOverlay(t, layer), mountOverlay(t, layer)

	if b, err := os.ReadFile(filepath.Join(o1, "big")); err != nil || !bytes.Equal(b, data) {
		t.Fatalf("read through first overlay: %v", err)
	}
	if res, tot := residentPages(t, filepath.Join(layer, "big")); res < tot*95/100 {
		t.Fatalf("after one read %d of %d pages of the layer file are cached", res, tot)
	}
	// Chunk files are written out and dropped from the page cache in the
	// background; let that finish so it does not count as the second read.
	e.cache.settle()
	before, _ := e.m.LayerStats(d)
	cached := meminfoCached(t)
	if b, err := os.ReadFile(filepath.Join(o2, "big")); err != nil || !bytes.Equal(b, data) {
		t.Fatalf("read through second overlay: %v", err)
	}
	grew := meminfoCached(t) - cached
	after, _ := e.m.LayerStats(d)
	t.Logf("second sandbox read: daemon served %d bytes, Cached grew %d bytes (file %d)", after.ReadBytes-before.ReadBytes, grew, size)
	// The kernel may reclaim a few pages in between; what matters is that
	// the second sandbox does not get its own copy.
	if after.ReadBytes-before.ReadBytes > size/20 || after.FetchedBytes != before.FetchedBytes {
		t.Fatalf("second overlay read went to the daemon: %+v -> %+v", before, after)
	}
	if grew > size/2 {
		t.Fatalf("page cache grew by %d bytes for a second read of a %d byte file", grew, size)
	}
}

func TestPassthroughForCachedFiles(t *testing.T) {
	e := newEnv(t, nil, 1<<30)
	src := t.TempDir()
	data := randData(4, 5<<20+100)
	writeFile(t, filepath.Join(src, "big"), data, 0o644)
	writeFile(t, filepath.Join(src, "one"), []byte("single chunk"), 0o644)
	d, _ := buildLayer(t, e.store, src, 1<<20)
	dir, release, err := e.m.Acquire(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"big", "one"} {
		if _, err := os.ReadFile(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	e.cache.settle()
	release() // grace 0: unmounted, so the next mount decides modes afresh
	if n := mountsUnder(t, dir); n != 0 {
		t.Fatalf("layer still mounted after its last release")
	}
	dir = e.acquire(t, d)
	before, _ := e.m.LayerStats(d)
	f1, err := os.Open(filepath.Join(dir, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f1.Close()
	// A second open while the first is in passthrough mode must work too.
	b, err := os.ReadFile(filepath.Join(dir, "big"))
	if err != nil || !bytes.Equal(b, data) {
		t.Fatalf("passthrough read: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "one")); err != nil || string(b) != "single chunk" {
		t.Fatalf("passthrough read of a one-chunk file: %q %v", b, err)
	}
	after, _ := e.m.LayerStats(d)
	if after.ReadBytes != before.ReadBytes {
		t.Fatalf("fully cached files were read through the daemon (%d bytes), not passthrough", after.ReadBytes-before.ReadBytes)
	}
	if cs := e.cache.Stats(); cs.Pinned == 0 {
		t.Fatalf("open passthrough file does not pin its backing file: %+v", cs)
	}
}

func TestMmapCachedAndPassthrough(t *testing.T) {
	e := newEnv(t, nil, 1<<30)
	src := t.TempDir()
	data := randData(80, 3<<20+4321)
	writeFile(t, filepath.Join(src, "lib.so"), data, 0o755)
	d, _ := buildLayer(t, e.store, src, 1<<20)
	sum := sha256.Sum256(data)
	want := hex.EncodeToString(sum[:])
	mmapRead := func(p string) string {
		t.Helper()
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "LAZYFS_MMAP_FILE="+p)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("mmap helper on %s: %v", p, err)
		}
		return string(out)
	}
	dir, release, err := e.m.Acquire(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	if got := mmapRead(filepath.Join(mountOverlay(t, dir), "lib.so")); got != want {
		t.Fatalf("mmap through the daemon: %s, want %s", got, want)
	}
	e.cache.settle()
	release()
	dir = e.acquire(t, d)
	before, _ := e.m.LayerStats(d)
	if got := mmapRead(filepath.Join(mountOverlay(t, dir), "lib.so")); got != want {
		t.Fatalf("mmap through passthrough: %s, want %s", got, want)
	}
	if after, _ := e.m.LayerStats(d); after.ReadBytes != before.ReadBytes {
		t.Fatalf("passthrough mapping was served by the daemon (%d bytes)", after.ReadBytes-before.ReadBytes)
	}
}

// A layer without any xattr answers ENOSYS so the kernel stops asking
// (ls -l asks two per file); a layer with xattrs serves them exactly.
func TestNoXattrLayerShortCircuits(t *testing.T) {
	for _, tc := range []struct {
		name     string
		withAttr bool
	}{{"no xattrs", false}, {"with xattrs", true}} {
		t.Run(tc.name, func(t *testing.T) {
			idx := &image.Index{Version: image.IndexVersion, Entries: []image.Entry{
				{Path: "", Type: image.TypeDir, Mode: 0o755},
				{Path: "f", Type: image.TypeReg, Mode: 0o644},
			}}
			if tc.withAttr {
				idx.Entries[1].Xattrs = map[string][]byte{"user.k": []byte("v")}
			}
			if got := !hasXattrs(idx); got == tc.withAttr {
				t.Fatalf("noXattrs = %v", got)
			}
			l := &layerFS{idx: idx, noXattrs: !hasXattrs(idx)}
			n := &node{l: l, e: &idx.Entries[1]}
			buf := make([]byte, 64)
			sz, errno := n.Getxattr(context.Background(), "user.k", buf)
			_, lerrno := n.Listxattr(context.Background(), make([]byte, 64))
			if tc.withAttr {
				if errno != 0 || string(buf[:sz]) != "v" || lerrno != 0 {
					t.Fatalf("getxattr = %q %v, listxattr %v", buf[:sz], errno, lerrno)
				}
				return
			}
			if errno != syscall.ENOSYS || lerrno != syscall.ENOSYS {
				t.Fatalf("getxattr %v, listxattr %v: want ENOSYS", errno, lerrno)
			}
		})
	}
}

// walkTree lists every directory under root (in chunks of 7 entries, so
// the kernel resumes listings at offsets), looks up a missing name in each,
// lstats every entry and reads every symlink. It returns one line per entry, relative to root: path,
// mode, size (not of directories) and symlink target.
func walkTree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	var walk func(rel string)
	walk = func(rel string) {
		f, err := os.Open(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for {
			ents, err := f.ReadDir(7)
			for _, de := range ents {
				names = append(names, de.Name())
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("list %q: %v", rel, err)
			}
		}
		f.Close()
		// A name that is not there, as an import searching its path asks.
		if err := unix.Lstat(filepath.Join(root, rel, "missing.py"), new(unix.Stat_t)); err != unix.ENOENT {
			t.Fatalf("lstat of a missing name in %q: %v, want ENOENT", rel, err)
		}
		sort.Strings(names)
		for _, name := range names {
			p := filepath.Join(rel, name)
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(root, p), &st); err != nil {
				t.Fatal(err)
			}
			line := fmt.Sprintf("%s %o", p, st.Mode)
			if st.Mode&unix.S_IFMT != unix.S_IFDIR { // a layer's directories are all 4096
				line += fmt.Sprintf(" %d", st.Size)
			}
			if st.Mode&unix.S_IFMT == unix.S_IFLNK {
				target, err := os.Readlink(filepath.Join(root, p))
				if err != nil {
					t.Fatal(err)
				}
				line += " -> " + target
			}
			out = append(out, line)
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				walk(p)
			}
		}
	}
	walk("")
	return out
}

// makeWideTree is a tree of nested directories, one with more entries than
// one READDIRPLUS reply holds, an empty one, files and symlinks.
func makeWideTree(t *testing.T) string {
	t.Helper()
	src := t.TempDir()
	for i := range 300 {
		writeFile(t, filepath.Join(src, fmt.Sprintf("wide/a-rather-long-file-name-%03d.py", i)), []byte("x = 1\n"), 0o644)
	}
	for i := range 5 {
		for j := range 5 {
			writeFile(t, filepath.Join(src, fmt.Sprintf("pkg%d/sub%d/mod.py", i, j)), []byte("y = 2\n"), 0o600)
			if err := os.Symlink("../../wide", filepath.Join(src, fmt.Sprintf("pkg%d/sub%d/link", i, j))); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.MkdirAll(filepath.Join(src, "empty/dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	return src
}

// A layer never changes, so once a tree was walked the kernel answers a
// repeated walk (listings, attributes, symlinks, missing names) from its
// caches: the daemon sees no request, directly on the layer or through an
// overlay. The listings the daemon serves are complete and in order when
// the kernel resumes them at offsets.
func TestRepeatedWalkSendsNoRequests(t *testing.T) {
	e := newEnv(t, nil, 1<<30)
	src := makeWideTree(t)
	d, _ := buildLayer(t, e.store, src, 1<<20)
	mnt := e.acquire(t, d)
	want := walkTree(t, src)
	if len(want) < 380 {
		t.Fatalf("source tree has only %d entries", len(want))
	}
	requests := func() uint64 {
		st, _ := e.m.LayerStats(d)
		return st.MetadataRequests
	}
	for _, root := range []string{mnt, mountOverlay(t, mnt)} {
		before := requests()
		if got := walkTree(t, root); !reflect.DeepEqual(got, want) {
			t.Fatalf("walk of %s differs from the source:\n got %q\nwant %q", root, got, want)
		}
		first := requests()
		if root == mnt && first == before {
			t.Fatalf("the first walk sent no request: not counted")
		}
		if got := walkTree(t, root); !reflect.DeepEqual(got, want) {
			t.Fatalf("second walk of %s differs from the source", root)
		}
		if again := requests(); again != first {
			t.Fatalf("second walk of %s sent %d requests, want 0 (first walk: %d)", root, again-first, first-before)
		}
	}
}

// Reading a file costs an OPEN and a RELEASE, and no FLUSH on close.
func TestOpenCloseSendsNoFlush(t *testing.T) {
	e := newEnv(t, nil, 1<<30)
	src := t.TempDir()
	writeFile(t, filepath.Join(src, "f"), []byte("data"), 0o644)
	d, _ := buildLayer(t, e.store, src, 1<<20)
	mnt := e.acquire(t, d)
	if _, err := os.Stat(filepath.Join(mnt, "f")); err != nil { // looked up
		t.Fatal(err)
	}
	requests := func() uint64 {
		st, _ := e.m.LayerStats(d)
		return st.MetadataRequests
	}
	before := requests()
	if b, err := os.ReadFile(filepath.Join(mnt, "f")); err != nil || string(b) != "data" {
		t.Fatalf("read %q: %v", b, err)
	}
	// A FLUSH is sent in close(2) itself; the RELEASE follows
	// asynchronously.
	waitFor(t, "the release", 5*time.Second, func() bool { return requests() >= before+2 })
	time.Sleep(50 * time.Millisecond)
	if n := requests() - before; n != 2 {
		t.Fatalf("open, read and close sent %d requests, want 2 (OPEN, RELEASE)", n)
	}
}
