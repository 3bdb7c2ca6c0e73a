package image

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Overlay xattrs met in an upper directory. opaque is kept (it is part of
// the overlay form). origin, impure, nlink, uuid, upper and protattr are
// bookkeeping of the mount that produced the upper and mean nothing in a
// lower layer, so they are dropped. redirect and metacopy mean the upper
// alone does not hold the data (a renamed directory, a metadata-only copy
// up): committing it would silently lose content, so it is refused; mount
// uppers with redirect_dir=off and metacopy=off (the kernel defaults).
var overlayRefused = map[string]bool{
	"trusted.overlay.redirect": true,
	"trusted.overlay.metacopy": true,
}

// addDir walks a directory into the layer without following symlinks and
// without crossing into other file systems. overlay selects overlay-upper
// semantics: 0/0 char devices are whiteouts and trusted.overlay.opaque=y is
// kept; otherwise (a rootfs directory) both are ordinary data subject to
// the device policy and xattr filter.
func (b *builder) addDir(root string, overlay bool) error {
	what := "directory " + root
	rootFi, err := os.Lstat(root)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s: %w", what, errdefs.ErrNotFound)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	if !rootFi.IsDir() {
		return fmt.Errorf("%s: not a directory: %w", what, errdefs.ErrInvalidArgument)
	}
	rootDev := rootFi.Sys().(*syscall.Stat_t).Dev
	type inode struct{ dev, ino uint64 }
	seen := map[inode]string{}
	return filepath.WalkDir(root, func(full string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if err := b.ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(root, full)
		if err != nil {
			return err
		}
		if rel == "." {
			rel = ""
		}
		rel = filepath.ToSlash(rel)
		fi, err := os.Lstat(full)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("%s: %q vanished during the walk: %w", what, rel, errdefs.ErrFailedPrecondition)
			}
			return fmt.Errorf("%s: %w", what, err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Dev != rootDev {
			b.cfg.log.Info("skipping mount point inside the tree", "path", rel)
			if fi.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		x, err := readXattrs(full, overlay)
		if err != nil {
			return fmt.Errorf("%s: %q: %w", what, rel, err)
		}
		e := &Entry{
			Path:    rel,
			Mode:    modeFromStat(st.Mode),
			UID:     int(st.Uid),
			GID:     int(st.Gid),
			ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec).UTC(),
			Xattrs:  x,
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			e.Type = TypeDir
			if !overlay {
				delete(e.Xattrs, XattrOpaque)
			}
			b.add(e)
		case unix.S_IFREG:
			if st.Nlink > 1 {
				key := inode{uint64(st.Dev), st.Ino}
				if t, ok := seen[key]; ok {
					return b.addHardlink(e, t, what)
				}
				seen[key] = rel
			}
			e.Type, e.Size = TypeReg, st.Size
			f, err := os.OpenFile(full, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NOATIME, 0)
			if errors.Is(err, syscall.EPERM) {
				f, err = os.OpenFile(full, os.O_RDONLY|unix.O_NOFOLLOW, 0)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			err = b.addRegFile(e, f)
			f.Close()
			return err
		case unix.S_IFLNK:
			t, err := os.Readlink(full)
			if err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			e.Type, e.Linkname = TypeSymlink, t
			b.add(e)
		case unix.S_IFCHR, unix.S_IFBLK:
			isChar := st.Mode&unix.S_IFMT == unix.S_IFCHR
			if overlay && isChar && st.Rdev == 0 {
				// A whiteout: normalised like the ones made from OCI names.
				b.add(&Entry{Path: rel, Type: TypeChar, UID: e.UID, GID: e.GID, ModTime: e.ModTime})
				return nil
			}
			if !b.cfg.keepDevices || (isChar && st.Rdev == 0) {
				b.cfg.log.Info("dropping device node (policy)", "path", rel)
				return nil
			}
			e.Type = TypeBlock
			if isChar {
				e.Type = TypeChar
			}
			e.Devmajor, e.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
			b.add(e)
		case unix.S_IFIFO:
			e.Type = TypeFifo
			b.add(e)
		default:
			b.cfg.log.Info("skipping socket or unknown file type", "path", rel)
		}
		return nil
	})
}

func modeFromStat(m uint32) os.FileMode {
	mode := os.FileMode(m & 0o777)
	if m&unix.S_ISUID != 0 {
		mode |= os.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= os.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= os.ModeSticky
	}
	return mode
}

// readXattrs returns a path's xattrs (not following symlinks), filtering
// overlay's own: see overlayRefused.
func readXattrs(p string, overlay bool) (map[string][]byte, error) {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, fmt.Errorf("listxattr: %w", err)
	}
	if sz == 0 {
		return nil, nil
	}
	buf := make([]byte, sz)
	sz, err = unix.Llistxattr(p, buf)
	if err != nil {
		return nil, fmt.Errorf("listxattr: %w", err)
	}
	var x map[string][]byte
	for _, name := range bytes.Split(buf[:sz], []byte{0}) {
		n := string(name)
		if n == "" {
			continue
		}
		if strings.HasPrefix(n, "trusted.overlay.") {
			if !overlay {
				continue
			}
			if overlayRefused[n] {
				return nil, fmt.Errorf("overlay xattr %s: the upper does not hold the full content (mount with redirect_dir=off,metacopy=off): %w", n, errdefs.ErrFailedPrecondition)
			}
			if n != XattrOpaque {
				continue
			}
		}
		v, err := lgetxattr(p, n)
		if err != nil {
			if errors.Is(err, unix.ENODATA) {
				continue // removed meanwhile
			}
			return nil, fmt.Errorf("getxattr %s: %w", n, err)
		}
		if n == XattrOpaque && string(v) != "y" {
			continue
		}
		if x == nil {
			x = map[string][]byte{}
		}
		x[n] = v
	}
	return x, nil
}

func lgetxattr(p, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(p, name, buf)
		if errors.Is(err, unix.ERANGE) {
			sz, err := unix.Lgetxattr(p, name, nil)
			if err != nil {
				return nil, err
			}
			buf = make([]byte, sz)
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}
