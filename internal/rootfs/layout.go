package rootfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Names inside a sandbox directory.
const (
	UpperName   = "upper"
	WorkName    = "work"
	PrivateName = "private"  // the subvolume holding upper and work
	DiskImage   = "disk.img" // sparse ext4 image, when limited
	DiskMount   = "disk"     // its mount point (inside the sandbox only)
)

// Overlay is an overlayfs mount described as data.
type Overlay struct {
	Lower []string // top-most first
	Upper string   // empty when the upper lives on Disk (created by the init)
	Work  string
}

// Layout is a prepared sandbox directory.
type Layout struct {
	Dir string
	// Root is where the overlay is to be mounted: the sandbox dir itself
	// (inside the sandbox's mount namespace only), which saves creating and
	// removing a mount point on the host's disk for every sandbox.
	Root    string
	Overlay Overlay
	Disk    *Disk // nil: no disk limit
}

// Disk is a size-limited file system for upper and work.
type Disk struct {
	Image    string
	Size     int64
	MountDir string // mount point, inside the sandbox's mount namespace
	FSType   string
	Loop     *Loop // attached device; Close once the disk is mounted
}

// ValidateLower checks that every lower layer is an absolute path to a
// directory.
func ValidateLower(lower []string) error {
	if len(lower) == 0 {
		return fmt.Errorf("no lower layers: %w", errdefs.ErrInvalidArgument)
	}
	for _, l := range lower {
		if !filepath.IsAbs(l) || strings.ContainsRune(l, 0) {
			return fmt.Errorf("lower layer %q is not an absolute path: %w", l, errdefs.ErrInvalidArgument)
		}
		st, err := os.Stat(l)
		if err != nil {
			return fmt.Errorf("lower layer %q: %w", l, errors.Join(errdefs.ErrInvalidArgument, err))
		}
		if !st.IsDir() {
			return fmt.Errorf("lower layer %q is not a directory: %w", l, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// Disks are the ways a sandbox's private layer can be bounded. With
// Subvolumes every sandbox dir is a subvolume below its root (limited by a
// quota when diskBytes > 0); otherwise a disk limit takes an image from
// Pool, and no limit means plain directories.
type Disks struct {
	Subvolumes *Subvolumes
	Pool       *DiskPool
}

// Prepare creates dir (which must not exist) with upper/work dirs, in a
// subvolume of disks.Subvolumes if set, or, if diskBytes > 0, a disk image
// from disks.Pool attached to a loop device. On error nothing is left
// behind.
func Prepare(ctx context.Context, dir string, lower []string, diskBytes int64, disks Disks) (_ *Layout, err error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("sandbox dir %q is not absolute: %w", dir, errdefs.ErrInvalidArgument)
	}
	if diskBytes < 0 {
		return nil, fmt.Errorf("disk size %d is negative: %w", diskBytes, errdefs.ErrInvalidArgument)
	}
	if diskBytes > 0 && diskBytes < MinDiskBytes {
		return nil, fmt.Errorf("disk size %d is below the minimum of %d: %w", diskBytes, MinDiskBytes, errdefs.ErrInvalidArgument)
	}
	if err := ValidateLower(lower); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
		return nil, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("sandbox dir %s: %w", dir, errdefs.ErrAlreadyExists)
		}
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = Remove(dir)
		}
	}()
	l := &Layout{Dir: dir, Root: dir, Overlay: Overlay{Lower: lower}}
	if sv := disks.Subvolumes; sv != nil {
		private := filepath.Join(dir, PrivateName)
		if err := sv.Create(private, diskBytes); err != nil {
			return nil, err
		}
		if err := l.Overlay.makeUpperWork(private); err != nil {
			return nil, err
		}
		return l, nil
	}
	if diskBytes == 0 {
		if err := l.Overlay.makeUpperWork(dir); err != nil {
			return nil, err
		}
		return l, nil
	}
	pool := disks.Pool
	if pool == nil {
		return nil, fmt.Errorf("disk limit requested but no disk pool configured: %w", errdefs.ErrFailedPrecondition)
	}
	d := &Disk{Image: filepath.Join(dir, DiskImage), Size: diskBytes, MountDir: filepath.Join(dir, DiskMount), FSType: "ext4"}
	if err := os.Mkdir(d.MountDir, 0o700); err != nil {
		return nil, err
	}
	if err := pool.Take(ctx, diskBytes, d.Image); err != nil {
		return nil, err
	}
	if d.Loop, err = AttachLoop(d.Image); err != nil {
		return nil, err
	}
	l.Disk = d
	return l, nil
}

// makeUpperWork creates the upper and work dirs in parent.
func (o *Overlay) makeUpperWork(parent string) error {
	o.Upper = filepath.Join(parent, UpperName)
	o.Work = filepath.Join(parent, WorkName)
	if err := os.Mkdir(o.Upper, 0o755); err != nil {
		return err
	}
	return os.Mkdir(o.Work, 0o700)
}

// Release drops the layout's hold on its loop device. The device then goes
// away (autoclear) when the last mount of it does.
func (l *Layout) Release() error {
	if l.Disk == nil || l.Disk.Loop == nil {
		return nil
	}
	err := l.Disk.Loop.Close()
	l.Disk.Loop = nil
	return err
}

const volatileDirty = WorkName + "/work/incompat/volatile/dirty"

var fastRemove = []string{volatileDirty, WorkName + "/work/incompat/volatile", WorkName + "/work/incompat",
	WorkName + "/work", WorkName, UpperName, DiskMount, ""}

// Remove deletes a sandbox directory. Mounts inside it exist only in the
// sandbox's mount namespace, so once its processes are gone this is a plain
// recursive delete, or one ioctl for a subvolume. A missing dir is not an
// error.
func Remove(dir string) error {
	if dir == "" || !filepath.IsAbs(dir) {
		return fmt.Errorf("refusing to remove %q: %w", dir, errdefs.ErrInvalidArgument)
	}
	if private := filepath.Join(dir, PrivateName); isSubvolume(private) {
		if err := destroySubvolume(private); err != nil {
			return err
		}
	}
	// Fast path for the usual layout (metadata operations are the cost of
	// a teardown on a slow disk): one syscall per entry, no directory reads.
	// The incompat entries are what overlayfs's volatile option leaves.
	for _, p := range fastRemove {
		rm := unix.Rmdir
		if p == volatileDirty {
			rm = unix.Unlink
		}
		if err := rm(filepath.Join(dir, p)); err != nil && !errors.Is(err, unix.ENOENT) {
			break
		}
	}
	return os.RemoveAll(dir)
}

// TreeUsage sums the allocated bytes of everything below dir.
func TreeUsage(dir string) int64 {
	var total int64
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil {
			total += st.Blocks * 512
		}
		return nil
	})
	return total
}
