//go:build linux && amd64

package seccomp

import "golang.org/x/sys/unix"

// ioctl request numbers, computed from the kernel's _IOC encoding
// (dir<<30 | size<<16 | type<<8 | nr) for x86_64.
const (
	ioctlFICLONE       = 0x40049409 // _IOW(0x94, 9, int)
	ioctlFICLONERANGE  = 0x4020940d // _IOW(0x94, 13, struct file_clone_range), 32 bytes
	ioctlFIDEDUPERANGE = 0xc0189436 // _IOWR(0x94, 54, struct file_dedupe_range), 24 bytes
	// _IOWR('X', 109, struct xfs_swapext): 5*8 + 16 pad + struct xfs_bstat
	// (136 bytes) = 192 = 0xc0.
	ioctlXFSSwapExt = 0xc0c0586d
	// _IOW('X', 129, struct xfs_exchange_range), 40 bytes: the 6.10
	// successor of XFS_IOC_SWAPEXT.
	ioctlXFSExchangeRange = 0x40285881
	ioctlTIOCSTI          = 0x5412
	ioctlTIOCLINUX        = 0x541c
)

// Personalities a program may set (what docker allows): PER_LINUX,
// PER_LINUX32, UNAME26, PER_LINUX32|UNAME26 and 0xffffffff, which only
// queries.
var safePersonalities = []uint32{0x0, 0x8, 0x20000, 0x20008, 0xffffffff}

// DefaultFilter returns the default seccomp program for sandbox processes
// on x86_64: default allow with a deny list; see the package
// documentation for the table.
func DefaultFilter(opts Options) (Filter, error) {
	return build(unix.AUDIT_ARCH_X86_64, rules(opts, unix.EPERM))
}

// rules lists the profile. eperm is the errno for plain denials: tests
// pass an unusual errno so a denial provably comes from the filter and
// not from the kernel.
func rules(opts Options, eperm unix.Errno) []rule {
	deny := retErrno(eperm)
	deny1 := func(name string, nr uintptr) rule {
		return rule{name: name, nr: uint32(nr), action: deny}
	}
	enosys := func(name string, nr uintptr) rule {
		return rule{name: name, nr: uint32(nr), action: retErrno(unix.ENOSYS)}
	}
	rs := []rule{
		// Mounts and the new mount API: the sandbox's mount tree is built
		// by the runtime and must not change from inside.
		deny1("mount", unix.SYS_MOUNT),
		deny1("umount2", unix.SYS_UMOUNT2),
		deny1("pivot_root", unix.SYS_PIVOT_ROOT),
		deny1("move_mount", unix.SYS_MOVE_MOUNT),
		deny1("open_tree", unix.SYS_OPEN_TREE),
		deny1("fsopen", unix.SYS_FSOPEN),
		deny1("fsconfig", unix.SYS_FSCONFIG),
		deny1("fsmount", unix.SYS_FSMOUNT),
		deny1("fspick", unix.SYS_FSPICK),
		deny1("mount_setattr", unix.SYS_MOUNT_SETATTR),
		// Kernel code and kernel-wide state.
		deny1("kexec_load", unix.SYS_KEXEC_LOAD),
		deny1("kexec_file_load", unix.SYS_KEXEC_FILE_LOAD),
		deny1("init_module", unix.SYS_INIT_MODULE),
		deny1("finit_module", unix.SYS_FINIT_MODULE),
		deny1("delete_module", unix.SYS_DELETE_MODULE),
		deny1("create_module", unix.SYS_CREATE_MODULE),
		deny1("get_kernel_syms", unix.SYS_GET_KERNEL_SYMS),
		deny1("query_module", unix.SYS_QUERY_MODULE),
		deny1("uselib", unix.SYS_USELIB),
		deny1("_sysctl", unix.SYS__SYSCTL),
		deny1("bpf", unix.SYS_BPF),
		deny1("perf_event_open", unix.SYS_PERF_EVENT_OPEN),
		deny1("lookup_dcookie", unix.SYS_LOOKUP_DCOOKIE),
		deny1("swapon", unix.SYS_SWAPON),
		deny1("swapoff", unix.SYS_SWAPOFF),
		deny1("reboot", unix.SYS_REBOOT),
		deny1("syslog", unix.SYS_SYSLOG),
		deny1("acct", unix.SYS_ACCT),
		deny1("quotactl", unix.SYS_QUOTACTL),
		deny1("quotactl_fd", unix.SYS_QUOTACTL_FD),
		deny1("nfsservctl", unix.SYS_NFSSERVCTL),
		deny1("vhangup", unix.SYS_VHANGUP),
		// Clocks are not namespaced.
		deny1("settimeofday", unix.SYS_SETTIMEOFDAY),
		deny1("clock_settime", unix.SYS_CLOCK_SETTIME),
		deny1("adjtimex", unix.SYS_ADJTIMEX),
		deny1("clock_adjtime", unix.SYS_CLOCK_ADJTIME),
		// The kernel keyring is not namespaced.
		deny1("keyctl", unix.SYS_KEYCTL),
		deny1("add_key", unix.SYS_ADD_KEY),
		deny1("request_key", unix.SYS_REQUEST_KEY),
		// File handles bypass path resolution (the "shocker" escape).
		deny1("open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT),
		deny1("name_to_handle_at", unix.SYS_NAME_TO_HANDLE_AT),
		// Raw port I/O.
		deny1("iopl", unix.SYS_IOPL),
		deny1("ioperm", unix.SYS_IOPERM),
		// Joining other namespaces.
		deny1("setns", unix.SYS_SETNS),
		// io_uring is a large attack surface that seccomp cannot see into
		// (its operations are not syscalls). ENOSYS looks like a kernel
		// built without it, which every io_uring user handles.
		enosys("io_uring_setup", unix.SYS_IO_URING_SETUP),
		enosys("io_uring_enter", unix.SYS_IO_URING_ENTER),
		enosys("io_uring_register", unix.SYS_IO_URING_REGISTER),
		{
			name: "personality", nr: unix.SYS_PERSONALITY, arg: 0,
			cases:     equalCases(safePersonalities, retAllow),
			otherwise: deny,
		},
		{
			name: "ioctl", nr: unix.SYS_IOCTL, arg: 1,
			cases: []argCase{
				// Shared extents escape per-sandbox disk accounting;
				// EOPNOTSUPP is what a file system without reflink says,
				// and cp --reflink=auto falls back to copying.
				{opEqual, ioctlFICLONE, retErrno(unix.EOPNOTSUPP)},
				{opEqual, ioctlFICLONERANGE, retErrno(unix.EOPNOTSUPP)},
				{opEqual, ioctlFIDEDUPERANGE, retErrno(unix.EOPNOTSUPP)},
				{opEqual, ioctlXFSSwapExt, retErrno(unix.EOPNOTSUPP)},
				{opEqual, ioctlXFSExchangeRange, retErrno(unix.EOPNOTSUPP)},
				// Terminal input injection.
				{opEqual, ioctlTIOCSTI, deny},
				{opEqual, ioctlTIOCLINUX, deny},
			},
			otherwise: retAllow,
		},
	}
	if !opts.AllowPtrace {
		rs = append(rs,
			deny1("ptrace", unix.SYS_PTRACE),
			deny1("process_vm_readv", unix.SYS_PROCESS_VM_READV),
			deny1("process_vm_writev", unix.SYS_PROCESS_VM_WRITEV))
	}
	if !opts.AllowUserfaultfd {
		rs = append(rs, deny1("userfaultfd", unix.SYS_USERFAULTFD))
	}
	if !opts.AllowUserNS {
		newUser := []argCase{{opAnyBits, unix.CLONE_NEWUSER, deny}}
		rs = append(rs,
			rule{name: "clone", nr: unix.SYS_CLONE, arg: 0, cases: newUser, otherwise: retAllow},
			rule{name: "unshare", nr: unix.SYS_UNSHARE, arg: 0, cases: newUser, otherwise: retAllow},
			// clone3 passes its flags in memory, which seccomp cannot read;
			// ENOSYS makes glibc fall back to clone, which is filtered.
			enosys("clone3", unix.SYS_CLONE3))
	}
	return rs
}

func equalCases(values []uint32, action uint32) []argCase {
	cs := make([]argCase, len(values))
	for i, v := range values {
		cs[i] = argCase{op: opEqual, value: v, action: action}
	}
	return cs
}
