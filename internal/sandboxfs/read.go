//go:build linux

package sandboxfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
)

// Open opens a regular file for streaming. The reader is independent of
// the Root (closing the Root does not close it) and is an *os.File, so
// io.Copy to a socket can use sendfile.
func (r *Root) Open(p string) (io.ReadCloser, *node.FileInfo, error) {
	abs, err := r.clean(p)
	if err != nil {
		return nil, nil, err
	}
	// O_PATH first: it does not run a device driver's open (a sandbox can
	// leave a device node, and the host's privileges must never open it)
	// and does not block on a FIFO.
	pfd, err := r.open(abs, unix.O_PATH)
	if err != nil {
		return nil, nil, wrap("open", abs, err)
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, nil, wrap("open", abs, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		return nil, nil, fmt.Errorf("sandboxfs: open %q: is a directory: %w", abs, errdefs.ErrFailedPrecondition)
	default:
		return nil, nil, fmt.Errorf("sandboxfs: open %q: not a regular file: %w", abs, errdefs.ErrInvalidArgument)
	}
	if err := checkFS("open", abs, pfd); err != nil {
		return nil, nil, err
	}
	// Reopen the very inode we checked; the path is not walked again.
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), unix.O_RDONLY|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, wrap("open", abs, err)
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, nil, wrap("open", abs, err)
	}
	return os.NewFile(uintptr(fd), abs), fileInfo(abs, &st, ""), nil
}

// Stat describes p, following a final symlink (inside the root).
func (r *Root) Stat(p string) (*node.FileInfo, error) {
	abs, err := r.clean(p)
	if err != nil {
		return nil, err
	}
	fd, err := r.open(abs, unix.O_PATH)
	if err != nil {
		return nil, wrap("stat", abs, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, wrap("stat", abs, err)
	}
	return fileInfo(abs, &st, ""), nil
}

// Lstat describes p itself; for a symlink, FileInfo.Symlink is its target.
func (r *Root) Lstat(p string) (*node.FileInfo, error) {
	abs, err := r.clean(p)
	if err != nil {
		return nil, err
	}
	if abs == "/" {
		var st unix.Stat_t
		if err := unix.Fstat(r.fd, &st); err != nil {
			return nil, wrap("lstat", abs, err)
		}
		return fileInfo(abs, &st, ""), nil
	}
	dfd, base, err := r.openParent("lstat", abs)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	return lstatAt(dfd, base, abs)
}

func lstatAt(dfd int, name, abs string) (*node.FileInfo, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, wrap("lstat", abs, err)
	}
	var target string
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		t, err := readlinkat(dfd, name)
		if err != nil {
			return nil, wrap("readlink", abs, err)
		}
		target = t
	}
	return fileInfo(abs, &st, target), nil
}

// ListDir lists the directory p (following a final symlink) down to depth
// levels (1 = its entries only). Entries are described like Lstat, sorted
// by name, each directory's entries right after it. Symlinks to
// directories are reported, not descended into.
func (r *Root) ListDir(p string, depth int) ([]node.FileInfo, error) {
	abs, err := r.clean(p)
	if err != nil {
		return nil, err
	}
	if depth < 1 {
		return nil, fmt.Errorf("sandboxfs: list %q: depth %d must be at least 1: %w", abs, depth, errdefs.ErrInvalidArgument)
	}
	fd, err := r.open(abs, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, wrap("list", abs, err)
	}
	var out []node.FileInfo
	err = r.list(fd, abs, depth, &out)
	unix.Close(fd)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// list appends the entries of the directory open as fd. It takes over fd
// only for reading; the caller closes it.
func (r *Root) list(fd int, abs string, depth int, out *[]node.FileInfo) error {
	names, err := readNames(fd, r.maxEntries-len(*out))
	if err == errTooMany {
		return r.tooMany(abs)
	}
	if err != nil {
		return wrap("list", abs, err)
	}
	for _, name := range names {
		child := path.Join(abs, name)
		fi, err := lstatAt(fd, name, child)
		if errdefs.IsNotFound(err) {
			continue // removed while we listed
		}
		if err != nil {
			return err
		}
		if len(*out) >= r.maxEntries {
			return r.tooMany(abs)
		}
		*out = append(*out, *fi)
		if !fi.IsDir || depth <= 1 {
			continue
		}
		// A single component, refusing symlinks: the entry may have been
		// swapped for a link since we looked at it.
		cfd, err := openat2(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW,
			unix.RESOLVE_BENEATH|unix.RESOLVE_NO_SYMLINKS|unix.RESOLVE_NO_MAGICLINKS)
		if err == unix.ENOENT || err == unix.ENOTDIR || err == unix.ELOOP {
			continue // changed under us; what we reported is what we saw
		}
		if err != nil {
			return wrap("list", child, err)
		}
		err = r.list(cfd, child, depth-1, out)
		unix.Close(cfd)
		if err != nil {
			return err
		}
	}
	return nil
}

func (r *Root) tooMany(abs string) error {
	return fmt.Errorf("sandboxfs: list %q: more than %d entries; ask for less depth: %w", abs, r.maxEntries, errdefs.ErrResourceExhausted)
}

var direntBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// errTooMany is returned by readNames when a directory has more entries
// than asked for.
var errTooMany = errors.New("too many entries")

// readNames returns the names in the directory open as fd, sorted,
// without "." and "..". With limit >= 0 it stops reading once it has more
// than limit names and returns them (unsorted) with errTooMany, so a huge
// directory is never read whole into memory.
func readNames(fd, limit int) ([]string, error) {
	if _, err := unix.Seek(fd, 0, io.SeekStart); err != nil {
		return nil, err
	}
	bp := direntBufs.Get().(*[]byte)
	defer direntBufs.Put(bp)
	buf := *bp
	var names []string
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			break
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
		if limit >= 0 && len(names) > limit {
			return names, errTooMany
		}
	}
	slices.Sort(names)
	return names, nil
}
