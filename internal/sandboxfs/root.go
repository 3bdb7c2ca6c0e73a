//go:build linux

package sandboxfs

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
)

// resolveFlags confine every lookup from the root descriptor: ".." and
// absolute symlinks stop at the root, and /proc magic links (which jump
// to wherever a process's root, cwd or fd points, including the host)
// are refused with ELOOP.
const resolveFlags = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// DefaultMaxListEntries caps ListDir so a listing cannot exhaust memory.
const DefaultMaxListEntries = 100_000

// maxTreeDepth caps recursive Remove, which holds one descriptor per level.
const maxTreeDepth = 1024

// Recursive Remove reads a directory removeBatch names at a time, and
// gives up on one that keeps refilling after maxRemovePasses batches.
// Variables so tests can use small batches.
var (
	removeBatch     = 10_000
	maxRemovePasses = 1 << 16
)

// Root is a sandbox's file system seen from the host through a directory
// (typically /proc/<init pid>/root). It keeps that directory open, so it
// stays valid whatever happens to the path, and resolves every path inside
// it. A Root is safe for concurrent use.
type Root struct {
	fd         int
	dir        string
	cwd        string
	maxEntries int
	log        *slog.Logger
}

var _ node.FileRoot = (*Root)(nil)

// Option configures a Root.
type Option func(*Root) error

// WithCwd sets the directory (inside the sandbox) that relative paths are
// resolved against. The default is "/".
func WithCwd(cwd string) Option {
	return func(r *Root) error {
		if cwd == "" || !path.IsAbs(cwd) || strings.IndexByte(cwd, 0) >= 0 {
			return fmt.Errorf("sandboxfs: cwd %q must be an absolute path: %w", cwd, errdefs.ErrInvalidArgument)
		}
		r.cwd = path.Clean(cwd)
		return nil
	}
}

// WithMaxListEntries caps the number of entries ListDir returns before it
// fails with ErrResourceExhausted.
func WithMaxListEntries(n int) Option {
	return func(r *Root) error {
		if n < 1 {
			return fmt.Errorf("sandboxfs: max list entries %d must be positive: %w", n, errdefs.ErrInvalidArgument)
		}
		r.maxEntries = n
		return nil
	}
}

// WithLogger sets the logger for problems that do not fail the call
// (a temporary file that could not be removed).
func WithLogger(l *slog.Logger) Option {
	return func(r *Root) error {
		if l == nil {
			return fmt.Errorf("sandboxfs: nil logger: %w", errdefs.ErrInvalidArgument)
		}
		r.log = l
		return nil
	}
}

// OpenRoot opens dir as a sandbox root.
func OpenRoot(dir string, opts ...Option) (*Root, error) {
	r := &Root{dir: dir, cwd: "/", maxEntries: DefaultMaxListEntries, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		if err := o(r); err != nil {
			return nil, err
		}
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, wrap("open root", dir, err)
	}
	r.fd = fd
	return r, nil
}

// Opener adapts OpenRoot to node.FileRootOpener.
func Opener(opts ...Option) node.FileRootOpener {
	return func(dir string) (node.FileRoot, error) { return OpenRoot(dir, opts...) }
}

// Close releases the root directory. Readers returned by Open stay valid.
func (r *Root) Close() error {
	if r.fd < 0 {
		return nil
	}
	err := unix.Close(r.fd)
	r.fd = -1
	return err
}

// clean validates p and returns it absolute and cleaned.
func (r *Root) clean(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("sandboxfs: empty path: %w", errdefs.ErrInvalidArgument)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("sandboxfs: path %q contains a NUL byte: %w", p, errdefs.ErrInvalidArgument)
	}
	if !path.IsAbs(p) {
		p = path.Join(r.cwd, p)
	}
	return path.Clean(p), nil
}

// rel turns a cleaned absolute path into one for openat2 on the root fd.
func rel(abs string) string {
	if abs == "/" {
		return "."
	}
	return abs[1:]
}

// open resolves abs inside the root.
func (r *Root) open(abs string, flags uint64) (int, error) {
	return openat2(r.fd, rel(abs), flags, resolveFlags)
}

func openat2(dirfd int, p string, flags, resolve uint64) (int, error) {
	how := unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Resolve: resolve}
	for tries := 0; ; tries++ {
		fd, err := unix.Openat2(dirfd, p, &how)
		// EAGAIN: a rename or mount raced with ".." resolution; the
		// kernel asks us to retry rather than risk a wrong answer.
		if (err == unix.EAGAIN && tries < 128) || err == unix.EINTR {
			continue
		}
		return fd, err
	}
}

// openParent opens the directory holding abs and returns it with the last
// component, so the final step can be done with a single-component *at
// call that never follows a symlink.
func (r *Root) openParent(op, abs string) (int, string, error) {
	if abs == "/" {
		return -1, "", fmt.Errorf("sandboxfs: %s %q: not allowed on the root directory: %w", op, abs, errdefs.ErrInvalidArgument)
	}
	fd, err := r.open(path.Dir(abs), unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return -1, "", wrap(op, abs, err)
	}
	return fd, path.Base(abs), nil
}

// Pseudo file systems whose contents the host must not read or change on
// a sandbox's behalf: the agent runs with the host's full privileges, so
// reading /proc/kallsyms or writing under /sys, /sys/fs/cgroup or
// binfmt_misc through it would give the sandbox what its own (lesser)
// credentials refuse. Metadata (Stat, ListDir) stays allowed.
const (
	configfsMagic = 0x62656570 // include/uapi/linux/magic.h
	fusectlMagic  = 0x65735543 // fs/fuse/control.c
)

var pseudoFS = map[int64]string{
	unix.PROC_SUPER_MAGIC:    "proc",
	unix.SYSFS_MAGIC:         "sysfs",
	unix.DEBUGFS_MAGIC:       "debugfs",
	unix.TRACEFS_MAGIC:       "tracefs",
	unix.SECURITYFS_MAGIC:    "securityfs",
	unix.CGROUP_SUPER_MAGIC:  "cgroup",
	unix.CGROUP2_SUPER_MAGIC: "cgroup2",
	unix.BPF_FS_MAGIC:        "bpf",
	configfsMagic:            "configfs",
	unix.EFIVARFS_MAGIC:      "efivarfs",
	unix.PSTOREFS_MAGIC:      "pstore",
	unix.SELINUX_MAGIC:       "selinuxfs",
	unix.SMACK_MAGIC:         "smackfs",
	unix.BINFMTFS_MAGIC:      "binfmt_misc",
	unix.NSFS_MAGIC:          "nsfs",
	fusectlMagic:             "fusectl",
}

func checkFS(op, abs string, fd int) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return wrap(op, abs, err)
	}
	if name, bad := pseudoFS[int64(st.Type)]; bad {
		return fmt.Errorf("sandboxfs: %s %q: refusing to touch a %s file system through the file API: %w", op, abs, name, errdefs.ErrPermissionDenied)
	}
	return nil
}

// wrap classifies a syscall error. The errno stays in the chain, so
// errors.Is(err, unix.ENOSPC) works as well as errdefs.IsResourceExhausted.
func wrap(op, p string, err error) error {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("sandboxfs: %s %q: %w", op, p, err)
	}
	var class error
	why := errno.Error()
	switch errno {
	case unix.ENOENT:
		class = errdefs.ErrNotFound
	case unix.EEXIST:
		class = errdefs.ErrAlreadyExists
	case unix.ENOSPC, unix.EDQUOT, unix.EFBIG, unix.EMFILE, unix.ENFILE:
		class = errdefs.ErrResourceExhausted
	case unix.EACCES, unix.EPERM, unix.EROFS:
		class = errdefs.ErrPermissionDenied
	case unix.ELOOP:
		class = errdefs.ErrInvalidArgument
		why = "too many symbolic links, or a /proc magic link, on the path"
	case unix.EXDEV:
		class = errdefs.ErrInvalidArgument
		why = "crosses a mount point"
	case unix.ENOTDIR:
		class = errdefs.ErrFailedPrecondition
		why = "a path component is not a directory"
	case unix.EISDIR:
		class = errdefs.ErrFailedPrecondition
		why = "is a directory"
	case unix.ENOTEMPTY:
		class = errdefs.ErrFailedPrecondition
		why = "directory not empty"
	case unix.EBUSY:
		class = errdefs.ErrFailedPrecondition
		why = "busy (a mount point?)"
	case unix.EINVAL, unix.ENAMETOOLONG, unix.EOPNOTSUPP:
		class = errdefs.ErrInvalidArgument
	case unix.ENOSYS:
		class = errdefs.ErrNotImplemented
		why = "openat2 is not supported by this kernel (needs Linux 5.6)"
	case unix.ENOMEM, unix.EIO:
		class = errdefs.ErrUnavailable
	default:
		return fmt.Errorf("sandboxfs: %s %q: %w", op, p, errno)
	}
	return &PathError{Op: op, Path: p, Why: why, class: class, errno: errno}
}

// PathError is a classified file-system error. errors.Is matches both its
// errdefs class and its errno.
type PathError struct {
	Op    string
	Path  string // inside the sandbox
	Why   string
	class error
	errno unix.Errno
}

func (e *PathError) Error() string { return fmt.Sprintf("sandboxfs: %s %q: %s", e.Op, e.Path, e.Why) }

// Unwrap returns the errdefs class and the errno.
func (e *PathError) Unwrap() []error { return []error{e.class, e.errno} }

// fileInfo converts a stat result.
func fileInfo(abs string, st *unix.Stat_t, target string) *node.FileInfo {
	name := path.Base(abs)
	mode := os.FileMode(st.Mode & 0o777)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= os.ModeDir
	case unix.S_IFLNK:
		mode |= os.ModeSymlink
	case unix.S_IFIFO:
		mode |= os.ModeNamedPipe
	case unix.S_IFSOCK:
		mode |= os.ModeSocket
	case unix.S_IFCHR:
		mode |= os.ModeDevice | os.ModeCharDevice
	case unix.S_IFBLK:
		mode |= os.ModeDevice
	}
	if st.Mode&unix.S_ISUID != 0 {
		mode |= os.ModeSetuid
	}
	if st.Mode&unix.S_ISGID != 0 {
		mode |= os.ModeSetgid
	}
	if st.Mode&unix.S_ISVTX != 0 {
		mode |= os.ModeSticky
	}
	return &node.FileInfo{
		Name:    name,
		Path:    abs,
		Size:    st.Size,
		Mode:    mode,
		ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
		IsDir:   st.Mode&unix.S_IFMT == unix.S_IFDIR,
		Symlink: target,
		UID:     int(st.Uid),
		GID:     int(st.Gid),
	}
}

// unixMode converts a permission mode to mode bits. Set-id and sticky
// bits are accepted both as os.FileMode flags and as raw 0o7000 bits, as
// an HTTP caller sending "4755" produces.
func unixMode(op, abs string, m os.FileMode) (uint32, error) {
	const raw = unix.S_ISUID | unix.S_ISGID | unix.S_ISVTX
	if m&^(os.ModePerm|os.ModeSetuid|os.ModeSetgid|os.ModeSticky|raw) != 0 {
		return 0, fmt.Errorf("sandboxfs: %s %q: mode %v is not a permission mode: %w", op, abs, m, errdefs.ErrInvalidArgument)
	}
	u := uint32(m) & (0o777 | raw)
	if m&os.ModeSetuid != 0 {
		u |= unix.S_ISUID
	}
	if m&os.ModeSetgid != 0 {
		u |= unix.S_ISGID
	}
	if m&os.ModeSticky != 0 {
		u |= unix.S_ISVTX
	}
	return u, nil
}

func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}
