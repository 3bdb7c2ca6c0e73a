//go:build linux

package sandboxfs

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/testutil"
)

func TestPaths(t *testing.T) {
	s := newSandbox(t, WithCwd("/home/user"))
	s.hostWrite(t, s.in("home/user/notes"), "relative")
	s.hostWrite(t, s.in("top"), "top")
	for _, tc := range []struct{ path, want string }{
		{"notes", "relative"},
		{"./notes", "relative"},
		{"../user/notes", "relative"},
		{"/home/user/notes", "relative"},
		{"//home//user/./notes", "relative"},
		{"../../top", "top"},
		{"/top", "top"},
	} {
		got, err := readAll(t, s.root, tc.path)
		if err != nil || got != tc.want {
			t.Fatalf("read %q = %q, %v; want %q", tc.path, got, err, tc.want)
		}
	}
	fi, err := s.root.Stat("notes")
	if err != nil || fi.Path != "/home/user/notes" || fi.Name != "notes" {
		t.Fatalf("stat notes: %+v, %v", fi, err)
	}
}

func TestBadInput(t *testing.T) {
	s := newSandbox(t)
	s.hostWrite(t, s.in("file"), "x")
	if err := os.MkdirAll(s.in("full/sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	s.symlink(t, "loop2", "loop1")
	s.symlink(t, "loop1", "loop2")
	if err := unix.Mkfifo(s.in("fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	body := func() io.Reader { return strings.NewReader("data") }
	write := func(p string) error { _, err := s.root.WriteFile(p, 0o644, body()); return err }
	cases := []struct {
		name  string
		err   error
		class error
	}{
		{"open empty path", func() error { _, _, err := s.root.Open(""); return err }(), errdefs.ErrInvalidArgument},
		{"open NUL", func() error { _, _, err := s.root.Open("/a\x00b"); return err }(), errdefs.ErrInvalidArgument},
		{"write empty path", write(""), errdefs.ErrInvalidArgument},
		{"write NUL", write("/x\x00"), errdefs.ErrInvalidArgument},
		{"stat empty path", func() error { _, err := s.root.Stat(""); return err }(), errdefs.ErrInvalidArgument},
		{"mkdir NUL", s.root.MkdirAll("/d\x00", 0o755), errdefs.ErrInvalidArgument},
		{"rename empty", s.root.Rename("", "/x"), errdefs.ErrInvalidArgument},
		{"rename to NUL", s.root.Rename("/file", "/x\x00"), errdefs.ErrInvalidArgument},
		{"remove NUL", s.root.Remove("\x00", false), errdefs.ErrInvalidArgument},
		{"list empty", func() error { _, err := s.root.ListDir("", 1); return err }(), errdefs.ErrInvalidArgument},
		{"open missing", func() error { _, _, err := s.root.Open("/missing"); return err }(), errdefs.ErrNotFound},
		{"stat missing", func() error { _, err := s.root.Stat("/missing/x"); return err }(), errdefs.ErrNotFound},
		{"open directory", func() error { _, _, err := s.root.Open("/full"); return err }(), errdefs.ErrFailedPrecondition},
		{"open fifo", func() error { _, _, err := s.root.Open("/fifo"); return err }(), errdefs.ErrInvalidArgument},
		{"open symlink loop", func() error { _, _, err := s.root.Open("/loop1"); return err }(), errdefs.ErrInvalidArgument},
		{"open through a file", func() error { _, _, err := s.root.Open("/file/x"); return err }(), errdefs.ErrFailedPrecondition},
		{"long name", write("/" + strings.Repeat("n", 300)), errdefs.ErrInvalidArgument},
		{"write root", write("/"), errdefs.ErrInvalidArgument},
		{"write over directory", write("/full"), errdefs.ErrFailedPrecondition},
		{"write through a file", write("/file/x"), errdefs.ErrAlreadyExists},
		{"write dir mode", func() error { _, err := s.root.WriteFile("/m", os.ModeDir|0o755, body()); return err }(), errdefs.ErrInvalidArgument},
		{"write junk mode", func() error { _, err := s.root.WriteFile("/m", 0o10644, body()); return err }(), errdefs.ErrInvalidArgument},
		{"mkdir over file", s.root.MkdirAll("/file", 0o755), errdefs.ErrAlreadyExists},
		{"mkdir through file", s.root.MkdirAll("/file/sub", 0o755), errdefs.ErrFailedPrecondition},
		{"mkdir symlink mode", s.root.MkdirAll("/m", os.ModeSymlink|0o755), errdefs.ErrInvalidArgument},
		{"remove root", s.root.Remove("/", true), errdefs.ErrInvalidArgument},
		{"remove missing", s.root.Remove("/missing", false), errdefs.ErrNotFound},
		{"remove non-empty", s.root.Remove("/full", false), errdefs.ErrFailedPrecondition},
		{"rename missing", s.root.Rename("/missing", "/x"), errdefs.ErrNotFound},
		{"rename into missing dir", s.root.Rename("/file", "/missing/x"), errdefs.ErrNotFound},
		{"rename root", s.root.Rename("/", "/x"), errdefs.ErrInvalidArgument},
		{"rename dir into itself", s.root.Rename("/full", "/full/sub/x"), errdefs.ErrInvalidArgument},
		{"list depth 0", func() error { _, err := s.root.ListDir("/", 0); return err }(), errdefs.ErrInvalidArgument},
		{"list a file", func() error { _, err := s.root.ListDir("/file", 1); return err }(), errdefs.ErrFailedPrecondition},
		{"bad cwd", func() error { _, err := OpenRoot(s.dir, WithCwd("rel")); return err }(), errdefs.ErrInvalidArgument},
		{"bad max entries", func() error { _, err := OpenRoot(s.dir, WithMaxListEntries(0)); return err }(), errdefs.ErrInvalidArgument},
		{"missing root", func() error { _, err := OpenRoot(filepath.Join(s.dir, "nope")); return err }(), errdefs.ErrNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			requireClass(t, tc.err, tc.class)
			if !strings.HasPrefix(tc.err.Error(), "sandboxfs: ") {
				t.Fatalf("error %q does not say where it comes from", tc.err)
			}
		})
	}
	// Nothing was lost: the files the bad calls named are intact.
	if got, _ := readAll(t, s.root, "/file"); got != "x" {
		t.Fatalf("/file = %q", got)
	}
	if _, err := os.Stat(s.in("full/sub")); err != nil {
		t.Fatal(err)
	}
	// The errno stays reachable.
	_, _, err := s.root.Open("/missing")
	if !errors.Is(err, unix.ENOENT) {
		t.Fatalf("%v does not wrap ENOENT", err)
	}
}

func TestWriteModes(t *testing.T) {
	old := syscall.Umask(0o077) // must not matter
	t.Cleanup(func() { syscall.Umask(old) })
	s := newSandbox(t)
	for _, tc := range []struct {
		mode os.FileMode
		want uint32
	}{
		{0o600, 0o600},
		{0o644, 0o644},
		{0o755, 0o755},
		{0o777, 0o777},
		{0o4755, unix.S_ISUID | 0o755}, // raw bits, as from an HTTP "4755"
		{0o2755, unix.S_ISGID | 0o755},
		{os.ModeSetuid | 0o755, unix.S_ISUID | 0o755},
		{os.ModeSetgid | 0o750, unix.S_ISGID | 0o750},
		{os.ModeSticky | 0o777, unix.S_ISVTX | 0o777},
		{0o1777, unix.S_ISVTX | 0o777},
		{0, 0o644}, // new file: default
	} {
		p := "/modes/f" + tc.mode.String()
		fi, err := s.root.WriteFile(p, tc.mode, strings.NewReader("x"))
		if err != nil {
			t.Fatalf("mode %v: %v", tc.mode, err)
		}
		var st unix.Stat_t
		if err := unix.Lstat(s.in(p), &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&0o7777 != tc.want {
			t.Fatalf("mode %v: file has %o, want %o", tc.mode, st.Mode&0o7777, tc.want)
		}
		if fi.Mode.Perm() != os.FileMode(tc.want&0o777) || !fi.Mode.IsRegular() && fi.Mode&os.ModeType != 0 {
			t.Fatalf("mode %v: FileInfo.Mode %v", tc.mode, fi.Mode)
		}
	}
	// Mode 0 keeps an existing file's permissions.
	if _, err := s.root.WriteFile("/keep", 0o604, strings.NewReader("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.root.WriteFile("/keep", 0, strings.NewReader("b")); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(s.in("keep")); fi.Mode().Perm() != 0o604 {
		t.Fatalf("mode 0 over a 0604 file gave %v", fi.Mode())
	}
	// MkdirAll applies the mode to every directory it creates, exactly.
	if err := s.root.MkdirAll("/dirs/a/b", 0o751); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"dirs", "dirs/a", "dirs/a/b"} {
		if fi, _ := os.Stat(s.in(d)); fi.Mode().Perm() != 0o751 || !fi.IsDir() {
			t.Fatalf("%s: %v", d, fi.Mode())
		}
	}
	// Existing directories are left alone.
	if err := s.root.MkdirAll("/dirs/a", 0o700); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(s.in("dirs/a")); fi.Mode().Perm() != 0o751 {
		t.Fatalf("existing dir changed to %v", fi.Mode())
	}
	// Parents created by WriteFile are 0755.
	if fi, _ := os.Stat(s.in("modes")); fi.Mode().Perm() != 0o755 {
		t.Fatalf("parent created by WriteFile: %v", fi.Mode())
	}
}

func TestOwnership(t *testing.T) {
	testutil.RequiresRoot(t)
	s := newSandbox(t)
	if err := os.MkdirAll(s.in("home/user"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(s.in("home/user"), 1000, 1001); err != nil {
		t.Fatal(err)
	}
	fi, err := s.root.WriteFile("/home/user/new/file", os.ModeSetuid|0o755, strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.UID != 1000 || fi.GID != 1001 {
		t.Fatalf("new file owned by %d:%d, want the directory's 1000:1001", fi.UID, fi.GID)
	}
	if fi.Mode&os.ModeSetuid == 0 {
		t.Fatal("chown cleared the setuid bit we asked for")
	}
	var st unix.Stat_t
	if err := unix.Stat(s.in("home/user/new"), &st); err != nil || st.Uid != 1000 || st.Gid != 1001 {
		t.Fatalf("created parent: %d:%d %v", st.Uid, st.Gid, err)
	}
	// Replacing keeps the old owner.
	s.hostWrite(t, s.in("home/user/owned"), "old")
	if err := os.Chown(s.in("home/user/owned"), 42, 43); err != nil {
		t.Fatal(err)
	}
	if fi, err := s.root.WriteFile("/home/user/owned", 0o600, strings.NewReader("new")); err != nil || fi.UID != 42 || fi.GID != 43 {
		t.Fatalf("replaced file: %+v, %v", fi, err)
	}
}

func TestReadWrite(t *testing.T) {
	s := newSandbox(t)
	fi, err := s.root.WriteFile("/a/b/c.txt", 0o640, strings.NewReader("hello"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Name != "c.txt" || fi.Path != "/a/b/c.txt" || fi.Size != 5 || fi.IsDir || fi.ModTime.IsZero() {
		t.Fatalf("FileInfo %+v", fi)
	}
	rc, rfi, err := s.root.Open("/a/b/c.txt")
	if err != nil {
		t.Fatal(err)
	}
	// The reader outlives the Root.
	r2, err := OpenRoot(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := r2.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(b) != "hello" || rfi.Size != 5 || rfi.Mode.Perm() != 0o640 {
		t.Fatalf("read %q %+v %v", b, rfi, err)
	}
	// Overwrite with empty content.
	if fi, err := s.root.WriteFile("/a/b/c.txt", 0o640, strings.NewReader("")); err != nil || fi.Size != 0 {
		t.Fatalf("empty write: %+v %v", fi, err)
	}
	// A failing reader leaves the old file and no temporary file.
	s.hostWrite(t, s.in("keep"), "original")
	_, err = s.root.WriteFile("/keep", 0o644, io.MultiReader(strings.NewReader("partial"), errReader{}))
	if err == nil || !errors.Is(err, errBoom) {
		t.Fatalf("write with failing reader: %v", err)
	}
	if got, _ := readAll(t, s.root, "/keep"); got != "original" {
		t.Fatalf("after failed write: %q", got)
	}
	requireNoTemp(t, s.dir)
}

var errBoom = errors.New("boom")

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errBoom }

func requireNoTemp(t *testing.T, dir string) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), ".dsec-tmp-") {
			t.Errorf("temporary file left behind: %s", p)
		}
		return nil
	})
}

// TestAtomicReplace: readers racing with writers only ever see complete
// versions of the file.
func TestAtomicReplace(t *testing.T) {
	s := newSandbox(t)
	versions := []string{strings.Repeat("a", 256<<10), strings.Repeat("b", 256<<10)}
	if _, err := s.root.WriteFile("/f", 0o644, strings.NewReader(versions[0])); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; !stop.Load(); i++ {
			if _, err := s.root.WriteFile("/f", 0o644, strings.NewReader(versions[i%2])); err != nil {
				t.Error(err)
				return
			}
		}
	})
	for range 200 {
		got, err := readAll(t, s.root, "/f")
		if err != nil {
			t.Fatal(err)
		}
		if got != versions[0] && got != versions[1] {
			t.Fatalf("reader saw a partial file of %d bytes", len(got))
		}
	}
	stop.Store(true)
	wg.Wait()
	requireNoTemp(t, s.dir)
}

// TestLargeStream streams a 200 MiB sparse file out and 64 MiB in, and
// checks neither is held in memory.
func TestLargeStream(t *testing.T) {
	s := newSandbox(t)
	const size = 200 << 20
	f, err := os.Create(s.in("big"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("TAIL"), size-4); err != nil {
		t.Fatal(err)
	}
	f.Close()

	before := allocated()
	rc, fi, err := s.root.Open("/big")
	if err != nil {
		t.Fatal(err)
	}
	tail := &tailWriter{}
	n, err := io.Copy(tail, struct{ io.Reader }{rc}) // plain reads, as over HTTP
	rc.Close()
	if err != nil || n != size || fi.Size != size || string(tail.last[:]) != "TAIL" {
		t.Fatalf("streamed %d bytes (size %d), tail %q, %v", n, fi.Size, tail.last, err)
	}
	if got := allocated() - before; got > 8<<20 {
		t.Fatalf("reading 200 MiB allocated %d bytes", got)
	}

	const in = 64 << 20
	before = allocated()
	wfi, err := s.root.WriteFile("/big-in", 0o644, io.LimitReader(zeros{}, in))
	if err != nil || wfi.Size != in {
		t.Fatalf("write: %+v %v", wfi, err)
	}
	if got := allocated() - before; got > 8<<20 {
		t.Fatalf("writing 64 MiB allocated %d bytes", got)
	}
}

func allocated() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.TotalAlloc
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

type tailWriter struct{ last [4]byte }

func (w *tailWriter) Write(p []byte) (int, error) {
	if len(p) >= 4 {
		copy(w.last[:], p[len(p)-4:])
	} else {
		copy(w.last[:], append(w.last[len(p):], p...))
	}
	return len(p), nil
}

// TestNoSpace fills a small tmpfs: the error is ErrResourceExhausted, the
// previous file is intact and no partial file is left.
func TestNoSpace(t *testing.T) {
	testutil.RequiresRoot(t)
	s := newSandbox(t)
	mountTmpfs(t, s.in("small"), "size=1m")
	s.hostWrite(t, s.in("small/target"), "previous")
	_, err := s.root.WriteFile("/small/target", 0o644, io.LimitReader(zeros{}, 4<<20))
	requireClass(t, err, errdefs.ErrResourceExhausted)
	if !errors.Is(err, unix.ENOSPC) || !strings.Contains(err.Error(), "/small/target") {
		t.Fatalf("error %q: want ENOSPC naming the path", err)
	}
	if got, _ := readAll(t, s.root, "/small/target"); got != "previous" {
		t.Fatalf("target after ENOSPC: %q", got)
	}
	requireNoTemp(t, s.dir)
	var st unix.Statfs_t
	if err := unix.Statfs(s.in("small"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Bfree < st.Blocks-2 {
		t.Fatalf("space not given back: %d of %d blocks free", st.Bfree, st.Blocks)
	}
}

func TestListDir(t *testing.T) {
	s := newSandbox(t)
	s.hostWrite(t, s.in("dir/b.txt"), "bb")
	s.hostWrite(t, s.in("dir/a.txt"), "a")
	s.hostWrite(t, s.in("dir/sub/deep/x"), "x")
	s.symlink(t, "/etc/passwd", "dir/link")
	s.symlink(t, s.outside, "dir/hostlink") // not descended into
	got, err := s.root.ListDir("/dir", 1)
	if err != nil {
		t.Fatal(err)
	}
	want1 := []string{"/dir/a.txt", "/dir/b.txt", "/dir/hostlink", "/dir/link", "/dir/sub"}
	if p := paths(got); strings.Join(p, " ") != strings.Join(want1, " ") {
		t.Fatalf("depth 1: %v, want %v", p, want1)
	}
	for _, fi := range got {
		switch fi.Name {
		case "b.txt":
			if fi.Size != 2 || fi.IsDir || fi.Mode.Perm() != 0o644 {
				t.Fatalf("%+v", fi)
			}
		case "link":
			if fi.Symlink != "/etc/passwd" || fi.Mode&os.ModeSymlink == 0 {
				t.Fatalf("%+v", fi)
			}
		case "sub":
			if !fi.IsDir || !fi.Mode.IsDir() {
				t.Fatalf("%+v", fi)
			}
		}
	}
	got, err = s.root.ListDir("/dir", 3)
	if err != nil {
		t.Fatal(err)
	}
	want3 := append(want1, "/dir/sub/deep", "/dir/sub/deep/x")
	if p := paths(got); strings.Join(p, " ") != strings.Join(want3, " ") {
		t.Fatalf("depth 3: %v, want %v", p, want3)
	}
	// Through a symlinked directory, as ls does.
	s.symlink(t, "/dir/sub", "sublink")
	if got, err := s.root.ListDir("/sublink", 1); err != nil || len(got) != 1 || got[0].Path != "/sublink/deep" {
		t.Fatalf("list via symlink: %v %v", paths(got), err)
	}
	// Cap.
	r, err := OpenRoot(s.dir, WithMaxListEntries(3))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, err = r.ListDir("/dir", 3)
	requireClass(t, err, errdefs.ErrResourceExhausted)
}

func paths(fis []node.FileInfo) []string {
	out := make([]string, len(fis))
	for i, fi := range fis {
		out[i] = fi.Path
	}
	return out
}
