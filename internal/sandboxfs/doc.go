// Package sandboxfs serves file operations on a running sandbox from the
// host, resolving every path inside the sandbox's root so that nothing a
// sandbox can put in its file system (symlinks, "..", /proc magic links,
// device nodes, racing renames) makes the host read or write outside it.
//
// A Root wraps a host directory that is the sandbox's "/", normally
// /proc/<init pid>/root: a path walk from it follows the sandbox's own
// mounts. OpenRoot keeps that directory open as an O_PATH descriptor, and
// every lookup is openat2(rootfd, path, RESOLVE_IN_ROOT |
// RESOLVE_NO_MAGICLINKS): ".." and absolute symlinks stop at the
// sandbox's root exactly as they would for a process inside it, and magic
// links (/proc/self/root, /proc/1/cwd, /proc/self/fd/N), which point
// wherever a process's root or descriptor does, fail with ELOOP. Paths
// from the API are cleaned first; relative ones are taken from "/" (or
// WithCwd); empty paths and NUL bytes are rejected.
//
// The last component is never resolved by path. Operations open its
// parent directory as above and finish with one single-name *at call
// (fstatat NOFOLLOW, mkdirat, unlinkat, renameat, openat O_EXCL|O_NOFOLLOW)
// on that descriptor, so a symlink at the end is acted on, not followed:
// WriteFile and Rename replace a link, Remove removes it.
//
// Writes are atomic replaces: data streams into an O_EXCL temporary file
// in the target's directory, gets its owner and mode with fchown/fchmod
// (umask never applies), and is renamed over the target; on any error the
// temporary file is removed and the old file is untouched. Replacing
// rather than writing in place also means a hard link into the sandbox
// can never be used to change a shared inode. New files and directories
// take the owner of the directory they are created in; a replaced file
// keeps its owner.
//
// Reads open the target O_PATH, check it is a regular file, then reopen
// that very inode through /proc/self/fd: the host never runs a device
// driver's open (a sandbox may leave device nodes) and never blocks on a
// FIFO. The returned reader is an *os.File, independent of the Root, so
// large files stream (and can use sendfile) without being held in memory.
//
// Recursive Remove walks directory descriptors with single-component
// openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV): a
// directory swapped for a symlink mid-walk is unlinked as a link, and the
// walk never enters another mount (like rm --one-file-system), so a bind
// mount's contents survive; it fails with ErrFailedPrecondition instead.
//
// Content operations (Open, WriteFile, MkdirAll, Remove, Rename) refuse
// pseudo file systems (proc, sysfs, cgroup, debugfs, tracefs, securityfs,
// bpf, binfmt_misc, ...): the agent acts with the host's full privileges,
// and reading /proc/kallsyms or creating a directory in a cgroup file
// system on a sandbox's behalf would hand it powers its own credentials
// lack. Stat, Lstat and ListDir still work there.
//
// Errors are *PathError values naming the operation and the path inside
// the sandbox; they match both an errdefs class and the errno with
// errors.Is: ENOENT is ErrNotFound, EEXIST ErrAlreadyExists,
// ENOSPC/EDQUOT/EFBIG ErrResourceExhausted, EACCES/EPERM/EROFS
// ErrPermissionDenied, ELOOP/EXDEV/EINVAL/ENAMETOOLONG ErrInvalidArgument,
// ENOTDIR/EISDIR/ENOTEMPTY/EBUSY ErrFailedPrecondition.
package sandboxfs
