package rootfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// btrfs ioctls (linux/btrfs.h); x/sys/unix does not define them.
const (
	btrfsIocSubvolCreate = 0x5000940e // _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	btrfsIocSnapDestroy  = 0x5000940f // _IOW(0x94, 15, struct btrfs_ioctl_vol_args)
	btrfsIocInoLookup    = 0xd0009412 // _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)
	btrfsIocFsInfo       = 0x8400941f // _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args)
	btrfsIocQuotaCtl     = 0xc0109428 // _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args)
	btrfsIocQgroupLimit  = 0x8030942b // _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)

	btrfsQuotaCtlEnableSimple = 4 // BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA (kernel >= 6.7)
	btrfsQgroupLimitMaxRfer   = 1 // BTRFS_QGROUP_LIMIT_MAX_RFER

	btrfsFirstFreeObjectID = 256 // a subvolume's root directory inode
	btrfsVolNameMax        = 4087
)

type btrfsVolArgs struct {
	Fd   int64
	Name [btrfsVolNameMax + 1]byte
}

type btrfsInoLookupArgs struct {
	TreeID   uint64
	ObjectID uint64
	Name     [4080]byte
}

type btrfsFsInfoArgs struct {
	MaxID      uint64
	NumDevices uint64
	FSID       [16]byte
	_          [1024 - 32]byte
}

type btrfsQuotaCtlArgs struct{ Cmd, Status uint64 }

type btrfsQgroupLimitArgs struct {
	QgroupID                                  uint64
	Flags, MaxRfer, MaxExcl, RsvRfer, RsvExcl uint64
}

func btrfsIoctl(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); e != 0 {
		return e
	}
	return nil
}

// Subvolumes keeps each sandbox's private layer (its upper and work dirs)
// in a btrfs subvolume of one file system per node, with a btrfs simple
// quota as its disk limit. The sandbox dir itself is a plain directory on
// that file system: what the platform keeps there (exec records) is not
// charged to the sandbox, so a sandbox that filled its disk still gets its
// exec results.
//
// Why: a file system per sandbox (DiskPool) costs a loop device, a
// superblock and milliseconds per create; ext4 and XFS project quotas need
// kernel options this kind of host lacks (QFMT_V2, XFS_QUOTA). A subvolume
// with a simple-quota limit is created in ~60 us and destroyed in ~25 us
// (the space is freed in the background), its quota counts data and
// metadata (so an inode bomb is bounded too), and it is enforced for root.
// Upper and work sit in the same subvolume because overlayfs renames
// between them (a rename across subvolumes is EXDEV).
type Subvolumes struct {
	root   string
	rootFD int
	fsid   string // names /sys/fs/btrfs/<fsid>
	log    *slog.Logger
	// mountedImage is set when Open mounted a node image (and Close may
	// unmount it).
	mountedImage string
}

// SubvolumeOptions configures OpenSubvolumes.
type SubvolumeOptions struct {
	// Image is the file a btrfs file system is made in and mounted from
	// when Root is not already on btrfs. It is created sparse.
	Image string
	// Size of a new Image; 0 = the free space of Image's file system at
	// creation. Writes beyond the host's free space fail in sandboxes with
	// EIO, as with any sparse image.
	Size   int64
	Mkfs   string // mkfs.btrfs; "" = looked up in PATH
	Logger *slog.Logger
}

// MinSubvolumeImageBytes is the smallest node image mkfs.btrfs accepts with
// its defaults, rounded up.
const MinSubvolumeImageBytes = 256 << 20

// OpenSubvolumes makes root the parent of sandbox subvolumes. If root is on
// btrfs already it is used as it is (it must have quotas on, unless it is
// o.Image mounted by an earlier run); otherwise o.Image is mounted on root,
// after creating and formatting it if it does not exist, and gets simple
// quotas.
func OpenSubvolumes(ctx context.Context, root string, o SubvolumeOptions) (_ *Subvolumes, err error) {
	s := &Subvolumes{root: root, rootFD: -1, log: o.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("subvolume root %q is not absolute: %w", root, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(root, 0o711); err != nil {
		return nil, err
	}
	onBtrfs, err := isBtrfs(root)
	if err != nil {
		return nil, err
	}
	if onBtrfs && o.Image != "" && isMountPoint(root) {
		if _, err := os.Stat(o.Image); err == nil {
			s.mountedImage = o.Image // mounted by an earlier server of this node
		}
	}
	if !onBtrfs {
		if o.Image == "" {
			return nil, fmt.Errorf("%s is not on btrfs and no image is configured: %w", root, errdefs.ErrFailedPrecondition)
		}
		if err := s.mountImage(ctx, o); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				_ = unix.Unmount(root, unix.MNT_DETACH)
			}
		}()
	}
	if s.rootFD, err = unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			unix.Close(s.rootFD)
		}
	}()
	var info btrfsFsInfoArgs
	if err := btrfsIoctl(s.rootFD, btrfsIocFsInfo, unsafe.Pointer(&info)); err != nil {
		return nil, fmt.Errorf("btrfs fs info of %s: %w", root, err)
	}
	s.fsid = formatUUID(info.FSID)
	if err := s.enableQuotas(); err != nil {
		return nil, err
	}
	return s, nil
}

func isBtrfs(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, err
	}
	return st.Type == unix.BTRFS_SUPER_MAGIC, nil
}

func isMountPoint(dir string) bool {
	var st, pst unix.Stat_t
	if unix.Stat(dir, &st) != nil || unix.Stat(filepath.Dir(dir), &pst) != nil {
		return false
	}
	return st.Dev != pst.Dev
}

func formatUUID(b [16]byte) string {
	h := fmt.Sprintf("%x", b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// mountImage mounts o.Image on s.root, making it first if needed.
func (s *Subvolumes) mountImage(ctx context.Context, o SubvolumeOptions) error {
	if ents, err := os.ReadDir(s.root); err != nil {
		return err
	} else if len(ents) > 0 {
		return fmt.Errorf("%s is not empty and not a mounted btrfs file system; refusing to mount over it: %w", s.root, errdefs.ErrFailedPrecondition)
	}
	if _, err := os.Stat(o.Image); errors.Is(err, os.ErrNotExist) {
		if err := makeBtrfsImage(ctx, o); err != nil {
			return err
		}
		s.log.Info("made node file system for sandbox layers", "image", o.Image)
	} else if err != nil {
		return err
	}
	lo, err := AttachLoop(o.Image)
	if err != nil {
		return err
	}
	// The mount keeps the (autoclear) loop device; our reference goes.
	defer lo.Close()
	if err := unix.Mount(lo.Path, s.root, "btrfs", unix.MS_NOATIME|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("mount %s (%s) on %s: %w", o.Image, lo.Path, s.root, err)
	}
	s.mountedImage = o.Image
	return nil
}

func makeBtrfsImage(ctx context.Context, o SubvolumeOptions) error {
	mkfs := o.Mkfs
	if mkfs == "" {
		m, err := exec.LookPath("mkfs.btrfs")
		if err != nil {
			return fmt.Errorf("mkfs.btrfs not found (install btrfs-progs): %w", errdefs.ErrFailedPrecondition)
		}
		mkfs = m
	}
	if err := os.MkdirAll(filepath.Dir(o.Image), 0o700); err != nil {
		return err
	}
	size := o.Size
	if size == 0 {
		var st unix.Statfs_t
		if err := unix.Statfs(filepath.Dir(o.Image), &st); err != nil {
			return err
		}
		size = int64(st.Bavail) * st.Bsize &^ (1<<20 - 1)
	}
	if size < MinSubvolumeImageBytes {
		return fmt.Errorf("node image size %d is below the minimum of %d: %w", size, MinSubvolumeImageBytes, errdefs.ErrInvalidArgument)
	}
	// single profiles: one device, nothing to mirror; metadata DUP would
	// only double the metadata written.
	return makeSparseImage(ctx, o.Image, size, mkfs, "-q", "-f", "-m", "single", "-d", "single")
}

// enableQuotas turns on simple quotas unless some quota mode is on.
func (s *Subvolumes) enableQuotas() error {
	mode, err := os.ReadFile(filepath.Join(s.sysfs(), "qgroups", "mode"))
	if err == nil && len(bytes.TrimSpace(mode)) > 0 {
		return nil
	}
	if s.mountedImage == "" {
		// Quotas are a property of the whole file system: not ours to
		// switch on for the host's btrfs.
		return fmt.Errorf("btrfs at %s has quotas off: enable them (btrfs quota enable --simple %s) or use per-sandbox loop disks: %w",
			s.root, s.root, errdefs.ErrFailedPrecondition)
	}
	args := btrfsQuotaCtlArgs{Cmd: btrfsQuotaCtlEnableSimple}
	if err := btrfsIoctl(s.rootFD, btrfsIocQuotaCtl, unsafe.Pointer(&args)); err != nil {
		return fmt.Errorf("enable btrfs simple quotas on %s (needs kernel >= 6.7): %w", s.root, err)
	}
	s.log.Info("enabled btrfs simple quotas", "root", s.root)
	return nil
}

func (s *Subvolumes) sysfs() string { return "/sys/fs/btrfs/" + s.fsid }

// Root is the directory sandbox dirs are made in.
func (s *Subvolumes) Root() string { return s.root }

// Create makes path, below Root in an existing directory, as a subvolume
// limited to limit bytes (data and metadata; 0 = no limit).
func (s *Subvolumes) Create(path string, limit int64) error {
	if err := s.check(path); err != nil {
		return err
	}
	if limit < 0 {
		return fmt.Errorf("disk limit %d is negative: %w", limit, errdefs.ErrInvalidArgument)
	}
	parent, err := unix.Open(filepath.Dir(path), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("create subvolume %s: %w", path, err)
	}
	defer unix.Close(parent)
	var args btrfsVolArgs
	copy(args.Name[:], filepath.Base(path))
	if err := btrfsIoctl(parent, btrfsIocSubvolCreate, unsafe.Pointer(&args)); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("%s: %w", path, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("create subvolume %s: %w", path, err)
	}
	if err := s.setup(path, limit); err != nil {
		_ = destroySubvolume(path)
		return err
	}
	return nil
}

func (s *Subvolumes) setup(path string, limit int64) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, 0o700); err != nil {
		return err
	}
	if limit == 0 {
		return nil
	}
	// qgroup id 0 means the subvolume fd's own qgroup.
	args := btrfsQgroupLimitArgs{Flags: btrfsQgroupLimitMaxRfer, MaxRfer: uint64(limit)}
	if err := btrfsIoctl(fd, btrfsIocQgroupLimit, unsafe.Pointer(&args)); err != nil {
		return fmt.Errorf("set disk limit of %s: %w", path, err)
	}
	return nil
}

// check accepts a clean absolute path strictly below Root.
func (s *Subvolumes) check(path string) error {
	name := filepath.Base(path)
	if !filepath.IsAbs(path) || filepath.Clean(path) != path || !strings.HasPrefix(path, s.root+"/") ||
		len(name) > btrfsVolNameMax || strings.ContainsRune(path, 0) {
		return fmt.Errorf("subvolume path %q is not a clean path below %s: %w", path, s.root, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Delete destroys the subvolume path with everything in it; btrfs frees
// the space in the background. A missing path is not an error.
func (s *Subvolumes) Delete(path string) error {
	if err := s.check(path); err != nil {
		return err
	}
	return destroySubvolume(path)
}

// destroySubvolume deletes the subvolume dir.
func destroySubvolume(dir string) error {
	parent, err := unix.Open(filepath.Dir(dir), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	defer unix.Close(parent)
	var args btrfsVolArgs
	copy(args.Name[:], filepath.Base(dir))
	if err := btrfsIoctl(parent, btrfsIocSnapDestroy, unsafe.Pointer(&args)); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("destroy subvolume %s: %w", dir, err)
	}
	return nil
}

// isSubvolume reports whether dir is the root of a btrfs subvolume.
func isSubvolume(dir string) bool {
	var st unix.Stat_t
	if unix.Lstat(dir, &st) != nil || st.Ino != btrfsFirstFreeObjectID || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return false
	}
	ok, err := isBtrfs(dir)
	return err == nil && ok
}

// Usage is the space the subvolume path holds (data and metadata) as its
// quota counts it: one small sysfs read, not a walk of the tree.
func (s *Subvolumes) Usage(path string) (int64, error) {
	if err := s.check(path); err != nil {
		return 0, err
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	args := btrfsInoLookupArgs{ObjectID: btrfsFirstFreeObjectID}
	if err := btrfsIoctl(fd, btrfsIocInoLookup, unsafe.Pointer(&args)); err != nil {
		return 0, fmt.Errorf("subvolume id of %s: %w", path, err)
	}
	b, err := os.ReadFile(filepath.Join(s.sysfs(), "qgroups", "0_"+strconv.FormatUint(args.TreeID, 10), "referenced"))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
}

// Close releases the root. If Open mounted the node image and nothing is
// left in it, the file system is unmounted (the loop device goes with
// it); otherwise it stays for the sandboxes that outlive this process.
func (s *Subvolumes) Close() error {
	if s.rootFD < 0 {
		return nil
	}
	unix.Close(s.rootFD)
	s.rootFD = -1
	if s.mountedImage == "" {
		return nil
	}
	ents, err := os.ReadDir(s.root)
	if err != nil {
		return err
	}
	if len(ents) > 0 {
		s.log.Info("node file system stays mounted for sandboxes", "root", s.root, "entries", len(ents))
		return nil
	}
	if err := unix.Unmount(s.root, 0); err != nil {
		return fmt.Errorf("unmount %s: %w", s.root, err)
	}
	return nil
}
