package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/blob"
)

func newTestStore(t testing.TB, opts ...Opt) (*Store, *blob.DirStore) {
	t.Helper()
	dir := t.TempDir()
	bs, err := blob.NewDirStore(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	meta, err := NewDirMeta(filepath.Join(dir, "meta"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewStore(bs, meta, append([]Opt{WithTempDir(dir)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s, bs
}

func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func writeFile(t testing.TB, p string, data []byte, mode os.FileMode) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.WriteFile(p, data, mode))
	must(t, os.Chmod(p, mode))
}

// makeTree builds a directory exercising every attribute dsec keeps:
// owners, modes with setuid/setgid/sticky, xattrs incl. security.capability,
// hardlinks (one whose link sorts before its target), symlinks (relative,
// absolute, dangling, outward), a fifo, a sparse file, multi-chunk files
// (compressible and not), nanosecond mtimes. With overlay it adds a
// whiteout and an opaque directory. Needs root.
func makeTree(t testing.TB, root string, overlay bool) {
	t.Helper()
	must(t, os.MkdirAll(root, 0o755))
	writeFile(t, filepath.Join(root, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o644)
	writeFile(t, filepath.Join(root, "empty"), nil, 0o600)
	writeFile(t, filepath.Join(root, "bin/tool"), randBytes(1, 3*1024*1024+4321), 0o755|os.ModeSetuid)
	must(t, os.Chmod(filepath.Join(root, "bin/tool"), 0o4755))
	writeFile(t, filepath.Join(root, "share/text"), bytes.Repeat([]byte("compressible line of text\n"), 100000), 0o644)
	writeFile(t, filepath.Join(root, "share/dup"), bytes.Repeat([]byte("compressible line of text\n"), 100000), 0o644)
	// sparse: 20 MiB with 10 KiB of data at 5 MiB and a tail byte
	sp, err := os.Create(filepath.Join(root, "sparse"))
	must(t, err)
	_, err = sp.WriteAt(randBytes(2, 10240), 5<<20)
	must(t, err)
	_, err = sp.WriteAt([]byte{1}, 20<<20-1)
	must(t, err)
	must(t, sp.Close())
	// hardlinks: zz/target first in walk order, aa/link sorts before it
	writeFile(t, filepath.Join(root, "zz/target"), []byte("linked content"), 0o640)
	must(t, os.MkdirAll(filepath.Join(root, "aa"), 0o755))
	must(t, os.Link(filepath.Join(root, "zz/target"), filepath.Join(root, "aa/link")))
	must(t, os.Link(filepath.Join(root, "zz/target"), filepath.Join(root, "zz/link2")))
	must(t, os.Symlink("../etc/passwd", filepath.Join(root, "bin/rel")))
	must(t, os.Symlink("/etc/shadow", filepath.Join(root, "bin/abs")))
	must(t, os.Symlink("nowhere", filepath.Join(root, "bin/dangling")))
	must(t, os.Symlink("../../../../outside", filepath.Join(root, "bin/outward")))
	must(t, unix.Mkfifo(filepath.Join(root, "fifo"), 0o620))
	must(t, os.MkdirAll(filepath.Join(root, "tmp"), 0o777))
	must(t, os.Chmod(filepath.Join(root, "tmp"), 0o777|os.ModeSticky))
	must(t, os.MkdirAll(filepath.Join(root, "setgid"), 0o755))
	must(t, os.Chmod(filepath.Join(root, "setgid"), 0o2775|os.ModeSetgid))
	must(t, os.MkdirAll(filepath.Join(root, "home/user"), 0o700))
	writeFile(t, filepath.Join(root, "home/user/file"), []byte("mine"), 0o600)
	must(t, os.Lchown(filepath.Join(root, "home/user"), 1000, 1001))
	must(t, os.Lchown(filepath.Join(root, "home/user/file"), 1000, 1001))
	must(t, os.Lchown(filepath.Join(root, "bin/rel"), 7, 8))
	// xattrs: a file capability (cap_net_raw+ep, v2 format) and others
	capv2 := []byte{0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0}
	must(t, unix.Lsetxattr(filepath.Join(root, "bin/tool"), "security.capability", capv2, 0))
	// After the capability: setting it clears setuid, as chown does.
	must(t, os.Chmod(filepath.Join(root, "bin/tool"), 0o755|os.ModeSetuid))
	must(t, unix.Lsetxattr(filepath.Join(root, "etc/passwd"), "user.note", []byte("hello"), 0))
	must(t, unix.Lsetxattr(filepath.Join(root, "etc"), "trusted.dsec", []byte{0, 1, 2}, 0))
	if overlay {
		must(t, unix.Mknod(filepath.Join(root, "etc/removed"), unix.S_IFCHR, 0))
		must(t, os.MkdirAll(filepath.Join(root, "opaque"), 0o755))
		writeFile(t, filepath.Join(root, "opaque/new"), []byte("new"), 0o644)
		must(t, unix.Lsetxattr(filepath.Join(root, "opaque"), XattrOpaque, []byte("y"), 0))
	}
	// mtimes with nanoseconds, children first so parents keep theirs
	var paths []string
	must(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		paths = append(paths, p)
		return err
	}))
	for i := len(paths) - 1; i >= 0; i-- {
		ts := unix.NsecToTimespec(time.Date(2024, 1, 2, 3, 4, 5, 123456789+i, time.UTC).UnixNano())
		must(t, unix.UtimesNanoAt(unix.AT_FDCWD, paths[i], []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW))
	}
}

// fileState is everything compared between two trees.
type fileState struct {
	mode    uint32
	uid     uint32
	gid     uint32
	size    int64
	rdev    uint64
	mtime   int64
	link    string
	sha     [32]byte
	xattrs  string
	inoPeer string // first path (sorted) sharing this inode
}

func treeState(t testing.TB, root string) map[string]fileState {
	t.Helper()
	out := map[string]fileState{}
	inodes := map[uint64][]string{}
	must(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		must(t, unix.Lstat(p, &st))
		fsx := fileState{mode: st.Mode, uid: st.Uid, gid: st.Gid, rdev: st.Rdev, mtime: st.Mtim.Nano()}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			must(t, err)
			fsx.size, fsx.sha = st.Size, sha256.Sum256(b)
			inodes[st.Ino] = append(inodes[st.Ino], rel)
		case unix.S_IFLNK:
			fsx.link, _ = os.Readlink(p)
		}
		fsx.xattrs = xattrString(t, p)
		out[rel] = fsx
		return nil
	}))
	for _, ps := range inodes {
		sort.Strings(ps)
		for _, p := range ps {
			s := out[p]
			s.inoPeer = ps[0]
			out[p] = s
		}
	}
	return out
}

func xattrString(t testing.TB, p string) string {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		return ""
	}
	buf := make([]byte, sz)
	sz, _ = unix.Llistxattr(p, buf)
	names := strings.Split(strings.TrimRight(string(buf[:sz]), "\x00"), "\x00")
	slices.Sort(names)
	var sb strings.Builder
	for _, n := range names {
		v, err := lgetxattr(p, n)
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		fmt.Fprintf(&sb, "%s=%x;", n, v)
	}
	return sb.String()
}

// compareTrees fails on any difference, skipping the root's mtime.
func compareTrees(t testing.TB, want, got string) {
	t.Helper()
	a, b := treeState(t, want), treeState(t, got)
	for p, sa := range a {
		sb, ok := b[p]
		if !ok {
			t.Errorf("%s: missing", p)
			continue
		}
		if p == "." {
			sa.mtime, sb.mtime = 0, 0
		}
		if sa != sb {
			t.Errorf("%s differs:\n want %+v\n got  %+v", p, sa, sb)
		}
	}
	for p := range b {
		if _, ok := a[p]; !ok {
			t.Errorf("%s: unexpected", p)
		}
	}
}

func countBlobs(t testing.TB, s blob.Store) int {
	t.Helper()
	n := 0
	must(t, s.Walk(context.Background(), func(blob.Info) error { n++; return nil }))
	return n
}

func blocks(t testing.TB, p string) int64 {
	var st syscall.Stat_t
	must(t, syscall.Stat(p, &st))
	return st.Blocks
}
