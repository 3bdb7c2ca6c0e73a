//go:build linux

package sandboxfs

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
)

const defaultFileMode = 0o644

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 128<<10); return &b }}

// WriteFile replaces p with the contents of rd, creating missing parent
// directories. The data goes to a temporary file in the same directory
// that is renamed over p at the end, so a reader sees the old file or the
// new one, never a part; on any error the temporary file is removed and p
// is unchanged. A symlink at p is replaced, never followed. mode is
// applied exactly (umask does not apply); mode 0 keeps the permissions of
// the file being replaced, or 0644 for a new file. The new file keeps the
// owner of the file it replaces; a new file, and any directory created
// for it, takes the owner of the directory it is created in, so writing
// into a user's home gives that user's files.
func (r *Root) WriteFile(p string, mode os.FileMode, rd io.Reader) (*node.FileInfo, error) {
	abs, err := r.clean(p)
	if err != nil {
		return nil, err
	}
	perm, err := unixMode("write", abs, mode)
	if err != nil {
		return nil, err
	}
	if abs == "/" {
		return nil, fmt.Errorf("sandboxfs: write %q: is the root directory: %w", abs, errdefs.ErrInvalidArgument)
	}
	dfd, err := r.mkdirAll(path.Dir(abs), 0o755)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	if err := checkFS("write", abs, dfd); err != nil {
		return nil, err
	}
	base := path.Base(abs)

	// Owner and permissions: from the file being replaced, else the
	// directory's owner and the default mode.
	var dst, dir unix.Stat_t
	if err := unix.Fstat(dfd, &dir); err != nil {
		return nil, wrap("write", abs, err)
	}
	uid, gid := dir.Uid, dir.Gid
	switch err := unix.Fstatat(dfd, base, &dst, unix.AT_SYMLINK_NOFOLLOW); {
	case err == nil && dst.Mode&unix.S_IFMT == unix.S_IFDIR:
		return nil, wrap("write", abs, unix.EISDIR) // fail before streaming, not at rename
	case err == nil && dst.Mode&unix.S_IFMT == unix.S_IFREG:
		uid, gid = dst.Uid, dst.Gid
		if perm == 0 {
			perm = dst.Mode & 0o7777
		}
	case err != nil && err != unix.ENOENT:
		return nil, wrap("write", abs, err)
	}
	if perm == 0 {
		perm = defaultFileMode
	}

	tmp, fd, err := createTemp(dfd)
	if err != nil {
		return nil, wrap("write", abs, err)
	}
	fi, err := r.fill(fd, abs, rd, uid, gid, perm)
	if err == nil {
		err = unix.Renameat(dfd, tmp, dfd, base)
		if err != nil {
			err = wrap("write", abs, err)
		}
	}
	if err != nil {
		if uerr := unix.Unlinkat(dfd, tmp, 0); uerr != nil && uerr != unix.ENOENT {
			r.log.Warn("sandboxfs: could not remove temporary file", "dir", r.dir, "path", path.Join(path.Dir(abs), tmp), "err", uerr)
		}
		return nil, err
	}
	return fi, nil
}

// createTemp makes an empty, private file next to the target.
func createTemp(dfd int) (string, int, error) {
	var b [8]byte
	for tries := 0; ; tries++ {
		rand.Read(b[:])
		name := ".dsec-tmp-" + hex.EncodeToString(b[:])
		fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == unix.EEXIST && tries < 8 {
			continue
		}
		return name, fd, err
	}
}

// fill streams rd into fd, sets owner and mode, and closes fd.
func (r *Root) fill(fd int, abs string, rd io.Reader, uid, gid, perm uint32) (*node.FileInfo, error) {
	f := os.NewFile(uintptr(fd), abs)
	w := &fileWriter{f: f}
	bp := copyBufs.Get().(*[]byte)
	// The wrappers hide ReadFrom/WriteTo so the pooled buffer is used
	// instead of a fresh 32 KiB one per call.
	_, err := io.CopyBuffer(w, struct{ io.Reader }{rd}, *bp)
	copyBufs.Put(bp)
	if err != nil {
		f.Close()
		if w.err != nil {
			return nil, wrapFileErr(abs, w.err)
		}
		return nil, fmt.Errorf("sandboxfs: write %q: reading the data: %w", abs, err)
	}
	// chown before chmod: chown clears set-id bits. Skipped when the
	// owner is already right, which also lets an unprivileged agent work.
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, wrap("write", abs, err)
	}
	if st.Uid != uid || st.Gid != gid {
		if err := unix.Fchown(fd, int(uid), int(gid)); err != nil {
			f.Close()
			return nil, wrap("write", abs, err)
		}
	}
	if err := unix.Fchmod(fd, perm); err != nil {
		f.Close()
		return nil, wrap("write", abs, err)
	}
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, wrap("write", abs, err)
	}
	// Some file systems (NFS, FUSE) report ENOSPC only at close.
	if err := f.Close(); err != nil {
		return nil, wrapFileErr(abs, err)
	}
	return fileInfo(abs, &st, ""), nil
}

// fileWriter records its own errors, so a failed write (ENOSPC) can be
// told apart from a failed read of the caller's data.
type fileWriter struct {
	f   *os.File
	err error
}

func (w *fileWriter) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	if err != nil {
		w.err = err
	}
	return n, err
}

func wrapFileErr(abs string, err error) error {
	var errno unix.Errno
	if errors.As(err, &errno) {
		return wrap("write", abs, errno)
	}
	return fmt.Errorf("sandboxfs: write %q: %w", abs, err)
}

// MkdirAll creates p and any missing parents with mode (applied exactly,
// without umask); new directories take the owner of their parent. It is
// not an error if p is already a directory.
func (r *Root) MkdirAll(p string, mode os.FileMode) error {
	abs, err := r.clean(p)
	if err != nil {
		return err
	}
	perm, err := unixMode("mkdir", abs, mode)
	if err != nil {
		return err
	}
	fd, err := r.mkdirAll(abs, perm)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// mkdirAll returns a descriptor of directory abs, creating it and its
// parents as needed. Each lookup starts again from the root with
// RESOLVE_IN_ROOT, and each creation is a single-component mkdirat on an
// already-resolved parent, so a symlink swapped in at any point is
// resolved inside the root and never escapes.
func (r *Root) mkdirAll(abs string, perm uint32) (int, error) {
	fd, err := r.open(abs, unix.O_PATH|unix.O_DIRECTORY)
	if err == nil {
		return fd, nil
	}
	if err == unix.ENOTDIR {
		if _, serr := r.Lstat(abs); serr == nil {
			return -1, fmt.Errorf("sandboxfs: mkdir %q: exists and is not a directory: %w", abs, errdefs.ErrAlreadyExists)
		}
	}
	if err != unix.ENOENT || abs == "/" {
		return -1, wrap("mkdir", abs, err)
	}
	pfd, err := r.mkdirAll(path.Dir(abs), perm)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	if err := checkFS("mkdir", abs, pfd); err != nil {
		return -1, err
	}
	base := path.Base(abs)
	switch err := unix.Mkdirat(pfd, base, 0o700); err {
	case nil:
		return adoptDir(pfd, base, abs, perm)
	case unix.EEXIST:
		// Created concurrently, or a dangling symlink is in the way.
		fd, err := r.open(abs, unix.O_PATH|unix.O_DIRECTORY)
		if err == unix.ENOENT || err == unix.ENOTDIR {
			return -1, fmt.Errorf("sandboxfs: mkdir %q: exists and is not a directory: %w", abs, errdefs.ErrAlreadyExists)
		}
		if err != nil {
			return -1, wrap("mkdir", abs, err)
		}
		return fd, nil
	default:
		return -1, wrap("mkdir", abs, err)
	}
}

// adoptDir gives a directory we just created its parent's owner and perm.
// It was created 0700 so nobody can use it before it has both.
func adoptDir(pfd int, base, abs string, perm uint32) (int, error) {
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, wrap("mkdir", abs, err)
	}
	var parent, st unix.Stat_t
	err = unix.Fstat(pfd, &parent)
	if err == nil {
		err = unix.Fstat(fd, &st)
	}
	if err == nil && (st.Uid != parent.Uid || st.Gid != parent.Gid) {
		err = unix.Fchown(fd, int(parent.Uid), int(parent.Gid))
	}
	if err == nil {
		err = unix.Fchmod(fd, perm)
	}
	if err != nil {
		unix.Close(fd)
		return -1, wrap("mkdir", abs, err)
	}
	return fd, nil
}

// Remove removes p (a symlink itself, never its target). A directory must
// be empty unless recursive is set. Recursive removal works on directory
// descriptors with single-component *at calls, refuses symlinks on the
// way down and does not cross into other mounts, so a concurrent rename
// or symlink swap cannot redirect it outside the tree.
func (r *Root) Remove(p string, recursive bool) error {
	abs, err := r.clean(p)
	if err != nil {
		return err
	}
	dfd, base, err := r.openParent("remove", abs)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := checkFS("remove", abs, dfd); err != nil {
		return err
	}
	return removeAt(dfd, base, abs, recursive, 0)
}

func removeAt(dfd int, name, abs string, recursive bool, depth int) error {
	for tries := 0; ; tries++ {
		err := unix.Unlinkat(dfd, name, 0)
		if err != unix.EISDIR {
			return wrapNil("remove", abs, err)
		}
		if recursive {
			if err := removeContents(dfd, name, abs, depth); err != nil {
				return err
			}
		}
		err = unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR)
		// ENOTDIR: it became a file meanwhile; ENOTEMPTY while
		// recursive: something was added; go round again (bounded).
		if (err == unix.ENOTDIR || (recursive && err == unix.ENOTEMPTY)) && tries < 8 {
			continue
		}
		return wrapNil("remove", abs, err)
	}
}

func removeContents(dfd int, name, abs string, depth int) error {
	if depth >= maxTreeDepth {
		return fmt.Errorf("sandboxfs: remove %q: directory tree deeper than %d levels: %w", abs, maxTreeDepth, errdefs.ErrFailedPrecondition)
	}
	fd, err := openat2(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW,
		unix.RESOLVE_BENEATH|unix.RESOLVE_NO_SYMLINKS|unix.RESOLVE_NO_MAGICLINKS|unix.RESOLVE_NO_XDEV)
	switch err {
	case nil:
	case unix.ENOENT, unix.ENOTDIR, unix.ELOOP:
		return nil // replaced meanwhile; the caller's unlink decides
	case unix.EXDEV:
		return fmt.Errorf("sandboxfs: remove %q: is a mount point: %w", abs, errdefs.ErrFailedPrecondition)
	default:
		return wrap("remove", abs, err)
	}
	defer unix.Close(fd)
	// Batches keep memory bounded in huge directories; each pass starts
	// again from the top, which also picks up entries created meanwhile,
	// but not forever.
	for pass := 0; pass < maxRemovePasses; pass++ {
		names, err := readNames(fd, removeBatch)
		if err != nil && err != errTooMany {
			return wrap("remove", abs, err)
		}
		if len(names) == 0 {
			return nil
		}
		for _, n := range names {
			err := removeAt(fd, n, path.Join(abs, n), true, depth+1)
			if err != nil && !errdefs.IsNotFound(err) {
				return err
			}
		}
	}
	return nil // the caller's rmdir reports ENOTEMPTY
}

func wrapNil(op, abs string, err error) error {
	if err == nil {
		return nil
	}
	return wrap(op, abs, err)
}

// Rename renames from to to, replacing to if it is a file (or an empty
// directory when from is a directory). Both ends are final components
// of resolved parents, so neither follows a symlink.
func (r *Root) Rename(from, to string) error {
	fabs, err := r.clean(from)
	if err != nil {
		return err
	}
	tabs, err := r.clean(to)
	if err != nil {
		return err
	}
	ffd, fbase, err := r.openParent("rename", fabs)
	if err != nil {
		return err
	}
	defer unix.Close(ffd)
	tfd, tbase, err := r.openParent("rename", tabs)
	if err != nil {
		return err
	}
	defer unix.Close(tfd)
	if err := checkFS("rename", fabs, ffd); err != nil {
		return err
	}
	if err := checkFS("rename", tabs, tfd); err != nil {
		return err
	}
	if err := unix.Renameat(ffd, fbase, tfd, tbase); err != nil {
		return wrap("rename", fabs+" -> "+tabs, err)
	}
	return nil
}
