package lazyfs

import (
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dsec-dev/dsec/internal/image"
)

// rawLayer sits between the kernel and go-fuse's node bridge. It lists
// directories without directory handles and counts the requests that reach
// the daemon (Stats.MetadataRequests).
//
// Directory opens: a layer's directories never change, so a directory
// needs no per-open state and the kernel may keep every listing in its
// page cache. When the kernel supports it (CAP_NO_OPENDIR_SUPPORT, Linux
// >= 5.1), the first OPENDIR is answered ENOSYS; from then on the kernel
// opens directories of the mount without asking, with FOPEN_CACHE_DIR |
// FOPEN_KEEP_CACHE, and sends no RELEASEDIR. A repeated walk of a tree
// whose listings and entries are cached costs no round trip at all, where
// OPENDIR with FOPEN_CACHE_DIR still cost two per directory. The READDIR
// and READDIRPLUS that fill the cache then carry no file handle, so they
// are served here from the node, found by its node ID (= inode number,
// fs.Options.ExternalNodeID).
type rawLayer struct {
	fuse.RawFileSystem // go-fuse's node bridge
	l                  *layerFS
	// handlelessDirs: the kernel opens directories without OPENDIR once
	// it was answered ENOSYS. Set in Init, before any request is served.
	handlelessDirs bool
}

func (r *rawLayer) Init(s *fuse.Server) {
	r.handlelessDirs = s.KernelSettings().Flags64()&fuse.CAP_NO_OPENDIR_SUPPORT != 0
	r.RawFileSystem.Init(s)
}

func (r *rawLayer) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	r.l.st.request()
	if r.handlelessDirs {
		return fuse.ENOSYS
	}
	return r.RawFileSystem.OpenDir(cancel, in, out)
}

// listing returns the entries of the directory with the given node ID;
// ok is false if it is not one of the layer's directories.
func (r *rawLayer) listing(nodeID uint64) (ents []fuse.DirEntry, ok bool) {
	if nodeID >= uint64(len(r.l.nodes)) {
		return nil, false
	}
	n := r.l.nodes[nodeID]
	if n == nil || n.e.Type != image.TypeDir {
		return nil, false
	}
	return n.listing(), true
}

func (r *rawLayer) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	r.l.st.request()
	if in.Fh != 0 {
		return r.RawFileSystem.ReadDir(cancel, in, out)
	}
	ents, ok := r.listing(in.NodeId)
	if !ok {
		return fuse.ENOTDIR
	}
	// Entry i carries offset i+1, so the kernel's offset is the index of
	// the next entry: no per-open cursor is needed.
	for _, de := range ents[min(in.Offset, uint64(len(ents))):] {
		if !out.AddDirEntry(de) {
			break
		}
	}
	return fuse.OK
}

func (r *rawLayer) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	r.l.st.request()
	if in.Fh != 0 {
		return r.RawFileSystem.ReadDirPlus(cancel, in, out)
	}
	ents, ok := r.listing(in.NodeId)
	if !ok {
		return fuse.ENOTDIR
	}
	for _, de := range ents[min(in.Offset, uint64(len(ents))):] {
		entry := out.AddDirLookupEntry(de)
		if entry == nil {
			break
		}
		// The bridge's lookup fills the attributes and timeouts and counts
		// the reference the kernel takes (and later FORGETs). It cannot
		// fail for a listed child of an immutable tree; if it did, the
		// entry would keep a zero node ID, which the kernel skips.
		r.RawFileSystem.Lookup(cancel, &in.InHeader, de.Name, entry)
	}
	return fuse.OK
}

// The remaining overrides only count requests. With the ones above they
// cover what walking, opening and closing files costs on a read-only
// mount; READ is accounted as bytes (Stats.ReadBytes), and FORGET has no
// reply.

func (r *rawLayer) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	r.l.st.request()
	return r.RawFileSystem.Lookup(cancel, h, name, out)
}

func (r *rawLayer) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	r.l.st.request()
	return r.RawFileSystem.GetAttr(cancel, in, out)
}

func (r *rawLayer) Statx(cancel <-chan struct{}, in *fuse.StatxIn, out *fuse.StatxOut) fuse.Status {
	r.l.st.request()
	return r.RawFileSystem.Statx(cancel, in, out)
}

func (r *rawLayer) Access(cancel <-chan struct{}, in *fuse.AccessIn) fuse.Status {
	r.l.st.request()
	return r.RawFileSystem.Access(cancel, in)
}

func (r *rawLayer) Readlink(cancel <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	r.l.st.request()
	return r.RawFileSystem.Readlink(cancel, h)
}

func (r *rawLayer) GetXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	r.l.st.request()
	return r.RawFileSystem.GetXAttr(cancel, h, attr, dest)
}

func (r *rawLayer) ListXAttr(cancel <-chan struct{}, h *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	r.l.st.request()
	return r.RawFileSystem.ListXAttr(cancel, h, dest)
}

func (r *rawLayer) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	r.l.st.request()
	return r.RawFileSystem.Open(cancel, in, out)
}

func (r *rawLayer) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	r.l.st.request()
	return r.RawFileSystem.Flush(cancel, in)
}

func (r *rawLayer) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	r.l.st.request()
	r.RawFileSystem.Release(cancel, in)
}

func (r *rawLayer) ReleaseDir(in *fuse.ReleaseIn) {
	r.l.st.request()
	r.RawFileSystem.ReleaseDir(in)
}

func (r *rawLayer) Lseek(cancel <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) fuse.Status {
	r.l.st.request()
	return r.RawFileSystem.Lseek(cancel, in, out)
}

func (r *rawLayer) StatFs(cancel <-chan struct{}, h *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	r.l.st.request()
	return r.RawFileSystem.StatFs(cancel, h, out)
}
