package lazyfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image"
)

// loadIndex reads a layer index with image.ReadIndex (which verifies its
// digest and the format's invariants) and checks what the tree builder
// relies on on top.
func loadIndex(ctx context.Context, src blob.Reader, d blob.Digest) (*image.Index, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	idx, err := image.ReadIndex(ctx, src, d)
	if errors.Is(err, blob.ErrDigestMismatch) {
		return nil, fmt.Errorf("%w: %w", err, ErrCorrupt)
	}
	if err != nil {
		return nil, err
	}
	if err := validateIndex(idx); err != nil {
		return nil, fmt.Errorf("layer index %s: %w", d, err)
	}
	return idx, nil
}

// validateIndex checks what the tree builder relies on, so a bad index is a
// clear error at Acquire and never a panic or a wrong tree later.
func validateIndex(idx *image.Index) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf(format+": %w", append(a, errdefs.ErrInvalidArgument)...)
	}
	if idx.Version != image.IndexVersion {
		return bad("unsupported index version %d", idx.Version)
	}
	types := map[string]string{}
	for i := range idx.Entries {
		e := &idx.Entries[i]
		p := e.Path
		if p != "" && (path.Clean(p) != p || strings.HasPrefix(p, "/") || p == "." || p == ".." || strings.HasPrefix(p, "../")) {
			return bad("entry %q: path not clean and relative", p)
		}
		if _, dup := types[p]; dup {
			return bad("entry %q: duplicate path", p)
		}
		if p == "" && e.Type != image.TypeDir {
			return bad("root entry is %q, not a directory", e.Type)
		}
		if p != "" {
			parent := path.Dir(p)
			if parent == "." {
				parent = ""
			}
			if t, ok := types[parent]; !ok || t != image.TypeDir {
				return bad("entry %q: parent is missing, not a directory or listed later", p)
			}
		}
		switch e.Type {
		case image.TypeReg:
			var end int64
			for _, ch := range e.Chunks {
				if digestHex(ch.Digest) == "" || (ch.Stored != "" && digestHex(ch.Stored) == "") {
					return bad("entry %q: malformed chunk digest %q", p, ch.Digest)
				}
				if ch.Offset < end || ch.Size <= 0 || ch.Size > maxChunkSize || ch.Offset+ch.Size > e.Size {
					return bad("entry %q: chunk at %d of %d bytes overlaps or lies outside the file", p, ch.Offset, ch.Size)
				}
				end = ch.Offset + ch.Size
			}
		case image.TypeHardlink:
			if t, ok := types[e.Linkname]; !ok || t == image.TypeDir || t == image.TypeHardlink {
				return bad("entry %q: hardlink target %q is not an earlier non-directory entry", p, e.Linkname)
			}
		case image.TypeDir, image.TypeSymlink, image.TypeChar, image.TypeBlock, image.TypeFifo:
		default:
			return bad("entry %q: unknown type %q", p, e.Type)
		}
		if e.Size < 0 {
			return bad("entry %q: negative size", p)
		}
		types[p] = e.Type
	}
	if _, ok := types[""]; !ok {
		return bad("no root entry")
	}
	return nil
}

// layerFS is one mounted layer.
type layerFS struct {
	digest      blob.Digest
	idx         *image.Index
	src         blob.Reader
	cache       *ChunkCache
	st          *layerStats
	log         *slog.Logger
	rec         *recorder
	passthrough bool
	// noXattrs: no entry of the layer has an xattr. Getxattr then answers
	// ENOSYS, after which the kernel stops asking for the whole mount
	// (FUSE caches no xattrs, and `ls -l` asks two per file).
	noXattrs bool
	// nodes[ino] is the node with that inode number, which is also its
	// FUSE node ID (rawLayer lists directories by node ID). Written once
	// by the root's OnAdd, before the mount serves requests.
	nodes []*node
}

func hasXattrs(idx *image.Index) bool {
	for i := range idx.Entries {
		if len(idx.Entries[i].Xattrs) > 0 {
			return true
		}
	}
	return false
}

func (l *layerFS) reader() reader { return reader{layer: l.digest, st: l.st} }

// root builds the tree when the mount attaches it.
func (l *layerFS) root() *node {
	var root *node
	for i := range l.idx.Entries {
		if l.idx.Entries[i].Path == "" {
			root = &node{l: l, e: &l.idx.Entries[i], ino: 1}
		}
	}
	return root
}

// inoOf is the inode number of the node of entry i; the root's is 1.
func inoOf(i int) uint64 { return uint64(i) + 2 }

// node is one inode. Hardlinked paths share one node.
type node struct {
	fs.Inode
	l     *layerFS
	e     *image.Entry
	ino   uint64
	nlink uint32

	dirOnce sync.Once
	dirents []fuse.DirEntry

	mu          sync.Mutex
	mode        ioMode
	cachedOpens int
	ptOpens     int
	backing     *backing
}

type ioMode int

const (
	modeUndecided ioMode = iota
	modeCached
	modePassthrough
)

var (
	_ fs.NodeOnAdder     = (*node)(nil)
	_ fs.NodeGetattrer   = (*node)(nil)
	_ fs.NodeGetxattrer  = (*node)(nil)
	_ fs.NodeListxattrer = (*node)(nil)
	_ fs.NodeReadlinker  = (*node)(nil)
	_ fs.NodeOpener      = (*node)(nil)

	_ fs.NodeOpendirHandler = (*node)(nil)
)

// OnAdd builds the whole tree under the root; the index was validated, so
// parents exist and come first.
func (n *node) OnAdd(ctx context.Context) {
	if n.e.Path != "" {
		return
	}
	entries := n.l.idx.Entries
	nodes := make(map[string]*node, len(entries))
	inodes := make(map[string]*fs.Inode, len(entries))
	nodes[""], inodes[""] = n, &n.Inode
	n.nlink = 2
	n.l.nodes = make([]*node, inoOf(len(entries)))
	n.l.nodes[n.ino] = n
	for i := range entries {
		e := &entries[i]
		if e.Path == "" {
			continue
		}
		dir, name := path.Split(e.Path)
		dir = strings.TrimSuffix(dir, "/")
		parent := inodes[dir]
		if e.Type == image.TypeHardlink {
			target := nodes[e.Linkname]
			target.nlink++
			parent.AddChild(name, inodes[e.Linkname], false)
			continue
		}
		child := &node{l: n.l, e: e, ino: inoOf(i), nlink: 1}
		n.l.nodes[child.ino] = child
		if e.Type == image.TypeDir {
			child.nlink = 2
			nodes[dir].nlink++
		}
		in := parent.NewPersistentInode(ctx, child, fs.StableAttr{Mode: typeBits(e.Type), Ino: child.ino})
		parent.AddChild(name, in, false)
		nodes[e.Path], inodes[e.Path] = child, in
	}
}

func typeBits(t string) uint32 {
	switch t {
	case image.TypeDir:
		return syscall.S_IFDIR
	case image.TypeSymlink:
		return syscall.S_IFLNK
	case image.TypeChar:
		return syscall.S_IFCHR
	case image.TypeBlock:
		return syscall.S_IFBLK
	case image.TypeFifo:
		return syscall.S_IFIFO
	default:
		return syscall.S_IFREG
	}
}

func modeBits(m os.FileMode) uint32 {
	b := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		b |= syscall.S_ISUID
	}
	if m&os.ModeSetgid != 0 {
		b |= syscall.S_ISGID
	}
	if m&os.ModeSticky != 0 {
		b |= syscall.S_ISVTX
	}
	return b
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.fill(&out.Attr)
	return 0
}

func (n *node) fill(a *fuse.Attr) {
	e := n.e
	a.Ino = n.ino
	a.Mode = typeBits(e.Type) | modeBits(e.Mode)
	a.Nlink = n.nlink
	a.Uid, a.Gid = uint32(e.UID), uint32(e.GID)
	switch e.Type {
	case image.TypeReg:
		a.Size = uint64(e.Size)
		var data int64
		for _, ch := range e.Chunks {
			data += ch.Size
		}
		a.Blocks = uint64(data+511) / 512
	case image.TypeSymlink:
		a.Size = uint64(len(e.Linkname))
	case image.TypeDir:
		a.Size = 4096
	case image.TypeChar, image.TypeBlock:
		a.Rdev = uint32(unix.Mkdev(uint32(e.Devmajor), uint32(e.Devminor)))
	}
	a.Blksize = 4096
	sec, nsec := uint64(e.ModTime.Unix()), uint32(e.ModTime.Nanosecond())
	if e.ModTime.IsZero() {
		sec, nsec = 0, 0
	}
	a.Mtime, a.Mtimensec = sec, nsec
	a.Ctime, a.Ctimensec = sec, nsec
	a.Atime, a.Atimensec = sec, nsec
}

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if n.l.noXattrs {
		return 0, syscall.ENOSYS
	}
	v, ok := n.e.Xattrs[attr]
	if !ok {
		return 0, syscall.ENODATA
	}
	if len(dest) == 0 {
		return uint32(len(v)), 0
	}
	if len(dest) < len(v) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	if n.l.noXattrs {
		return 0, syscall.ENOSYS
	}
	names := make([]string, 0, len(n.e.Xattrs))
	size := 0
	for k := range n.e.Xattrs {
		names = append(names, k)
		size += len(k) + 1
	}
	if len(dest) == 0 {
		return uint32(size), 0
	}
	if len(dest) < size {
		return uint32(size), syscall.ERANGE
	}
	sort.Strings(names)
	off := 0
	for _, k := range names {
		off += copy(dest[off:], k)
		dest[off] = 0
		off++
	}
	return uint32(off), 0
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	if n.e.Type != image.TypeSymlink {
		return nil, syscall.EINVAL
	}
	return []byte(n.e.Linkname), 0
}

// listing returns the directory's entries, sorted by name, entry i at
// offset i+1. Built on first use and shared: it never changes.
func (n *node) listing() []fuse.DirEntry {
	n.dirOnce.Do(func() {
		kids := n.Children()
		names := make([]string, 0, len(kids))
		for name := range kids {
			names = append(names, name)
		}
		sort.Strings(names)
		n.dirents = make([]fuse.DirEntry, len(names))
		for i, name := range names {
			in := kids[name]
			n.dirents[i] = fuse.DirEntry{Name: name, Mode: in.Mode(), Ino: in.StableAttr().Ino, Off: uint64(i) + 1}
		}
	})
	return n.dirents
}

// OpendirHandle lets the kernel cache the listing (FOPEN_CACHE_DIR): a
// layer's directories never change, so each is listed by the daemon once.
// Only used on kernels that cannot open directories without OPENDIR (see
// rawLayer).
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return &dirHandle{ents: n.listing()}, fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE, 0
}

// dirHandle lists a directory from the shared, immutable entry slice.
type dirHandle struct {
	ents []fuse.DirEntry
	pos  int
}

var (
	_ fs.FileReaddirenter = (*dirHandle)(nil)
	_ fs.FileSeekdirer    = (*dirHandle)(nil)
)

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if d.pos >= len(d.ents) {
		return nil, 0
	}
	de := d.ents[d.pos] // a copy: go-fuse may modify it
	d.pos++
	return &de, 0
}

func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	d.pos = int(min(off, uint64(len(d.ents))))
	return 0
}

// openFlags: keep the page cache across opens (the file never changes),
// and no FLUSH round trip on every close(2): nothing is ever written.
const openFlags = fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH

// Open picks the file's I/O mode on its first open in this mount and keeps
// it, because the kernel refuses to mix cached and passthrough opens of one
// inode and because switching would give the file a second page cache copy.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if n.e.Type != image.TypeReg {
		return nil, 0, syscall.EINVAL
	}
	if flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC) != 0 {
		return nil, 0, syscall.EROFS
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.mode == modeUndecided {
		n.mode = modeCached
		if n.l.passthrough {
			if b, ok := n.l.cache.openBacking(n.e.Chunks, n.e.Size); ok {
				n.mode, n.backing = modePassthrough, b
			}
		}
	}
	if n.mode == modePassthrough && n.cachedOpens == 0 {
		if n.backing == nil {
			// Reopen the copy; if it was evicted while nothing had it open,
			// fall back to reads through the daemon (correct, rarely hit).
			b, ok := n.l.cache.openBacking(n.e.Chunks, n.e.Size)
			if !ok {
				n.mode = modeCached
				return n.openCached()
			}
			n.backing = b
		}
		n.ptOpens++
		n.l.rec.record(n.e.Path)
		return &ptHandle{n: n, b: n.backing}, openFlags, 0
	}
	return n.openCached()
}

// must hold n.mu
func (n *node) openCached() (fs.FileHandle, uint32, syscall.Errno) {
	n.cachedOpens++
	return &cachedHandle{n: n}, openFlags, 0
}

// readAt serves a read through the daemon: chunks from the cache (fetching
// on a miss), holes as zeros.
func (n *node) readAt(ctx context.Context, dest []byte, off int64) (int, syscall.Errno) {
	e := n.e
	if off >= e.Size {
		return 0, 0
	}
	if rem := e.Size - off; int64(len(dest)) > rem {
		dest = dest[:rem]
	}
	n.l.rec.record(e.Path)
	end := off + int64(len(dest))
	i := sort.Search(len(e.Chunks), func(i int) bool { return e.Chunks[i].Offset+e.Chunks[i].Size > off })
	pos := off
	for ; pos < end; i++ {
		next := end
		if i < len(e.Chunks) && e.Chunks[i].Offset < end {
			next = max(e.Chunks[i].Offset, pos)
		}
		clear(dest[pos-off : next-off])
		pos = next
		if pos >= end {
			break
		}
		ch := e.Chunks[i]
		stop := min(end, ch.Offset+ch.Size)
		if err := n.l.cache.readChunk(ctx, n.l.src, ch, dest[pos-off:stop-off], pos-ch.Offset, n.l.reader()); err != nil {
			n.l.log.Error("lazyfs: read failed", "layer", n.l.digest, "path", e.Path, "chunk", ch.Digest, "err", err)
			return 0, syscall.EIO
		}
		pos = stop
	}
	n.l.st.served(len(dest))
	return len(dest), 0
}

// cachedHandle reads through the daemon; the kernel keeps the pages.
type cachedHandle struct{ n *node }

var (
	_ fs.FileReader   = (*cachedHandle)(nil)
	_ fs.FileReleaser = (*cachedHandle)(nil)
)

func (h *cachedHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	m, errno := h.n.readAt(ctx, dest, off)
	if errno != 0 {
		return nil, errno
	}
	return fuse.ReadResultData(dest[:m]), 0
}

func (h *cachedHandle) Release(ctx context.Context) syscall.Errno {
	h.n.mu.Lock()
	h.n.cachedOpens--
	h.n.mu.Unlock()
	return 0
}

// ptHandle is backed by a whole-file copy in the cache; the kernel reads it
// directly once go-fuse registers the backing fd.
type ptHandle struct {
	n *node
	b *backing
}

var (
	_ fs.FilePassthroughFder = (*ptHandle)(nil)
	_ fs.FileReader          = (*ptHandle)(nil)
	_ fs.FileReleaser        = (*ptHandle)(nil)
)

func (h *ptHandle) PassthroughFd() (int, bool) { return int(h.b.f.Fd()), true }

// Read is used only when the kernel refused passthrough.
func (h *ptHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	m, err := h.b.f.ReadAt(dest, off)
	if err != nil && err != io.EOF {
		return nil, fs.ToErrno(err)
	}
	h.n.l.st.served(m)
	return fuse.ReadResultData(dest[:m]), 0
}

func (h *ptHandle) Release(ctx context.Context) syscall.Errno {
	n := h.n
	n.mu.Lock()
	defer n.mu.Unlock()
	n.ptOpens--
	if n.ptOpens == 0 && n.backing != nil {
		n.backing.Close()
		n.backing = nil
	}
	return 0
}
