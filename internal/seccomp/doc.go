// Package seccomp builds the default seccomp filter for sandbox processes.
//
// DefaultFilter returns a classic BPF program ([]unix.SockFilter) for
// seccomp(SECCOMP_SET_MODE_FILTER); Filter.MarshalBinary gives the raw
// struct sock_filter array (8 bytes per instruction, little endian) for the
// runtime's C shim, and Filter.Install loads it into the calling Go process
// (no_new_privs + TSYNC).
//
// # Design
//
// The profile is default allow with a deny list: sandboxes run arbitrary
// Linux userlands, and an allow list breaks them in ways that are hard to
// debug, while the dangerous surface is a short, well-known list. The
// sandbox's capabilities, namespaces and cgroups are the other layers;
// this filter removes kernel interfaces that are not namespaced or that
// have a history of escapes.
//
// The program is generated here rather than by a library. The candidates
// fall short: github.com/elastic/go-seccomp-bpf sends a foreign arch to
// the default action (allow, in a deny list, so int $0x80 with i386
// numbers would bypass every rule), answers x32 with ENOSYS instead of
// killing, and compares 64-bit arguments, which the kernel truncates to
// 32 bits for ioctl and personality (the CVE-2019-10063 TIOCSTI bypass);
// libseccomp needs cgo. The generator is a straight line of
// self-contained blocks, one per syscall, so every jump is short and
// forward and the program is easy to audit (TestArchCheck interprets it).
// A linear scan costs nothing for most syscalls: since Linux 5.11 the
// kernel caches, per syscall number, filters whose result does not
// depend on the arguments, so only clone, unshare, ioctl and personality
// run the program.
//
// Order of checks: the arch must be AUDIT_ARCH_X86_64 (anything else, such
// as i386 via int $0x80, kills the process: 32-bit binaries do not run in
// sandboxes); a syscall number with the x32 bit (0x40000000) kills the
// process, except -1, which gets ENOSYS as the kernel would; then the
// rules below; then allow. vm86 and vm86old exist only in the i386
// table, so the arch check is what blocks them.
//
// Argument checks compare only the low 32 bits, because the kernel
// ignores the upper half of these arguments (clone flags are truncated by
// lower_32_bits, ioctl cmd and personality are unsigned int).
//
// # Profile
//
//	| syscall            | action        | why |
//	|--------------------|---------------|-----|
//	| mount              | EPERM         | the mount tree is built by the runtime |
//	| umount2            | EPERM         | could reveal what a mount covers |
//	| pivot_root         | EPERM         | mount tree |
//	| move_mount         | EPERM         | new mount API |
//	| open_tree          | EPERM         | new mount API |
//	| fsopen             | EPERM         | new mount API |
//	| fsconfig           | EPERM         | new mount API |
//	| fsmount            | EPERM         | new mount API |
//	| fspick             | EPERM         | new mount API |
//	| mount_setattr      | EPERM         | new mount API |
//	| kexec_load         | EPERM         | loads a new kernel |
//	| kexec_file_load    | EPERM         | loads a new kernel |
//	| init_module        | EPERM         | kernel modules |
//	| finit_module       | EPERM         | kernel modules |
//	| delete_module      | EPERM         | kernel modules |
//	| create_module      | EPERM         | obsolete module call |
//	| get_kernel_syms    | EPERM         | obsolete module call |
//	| query_module       | EPERM         | obsolete module call |
//	| uselib             | EPERM         | obsolete, a.out loader |
//	| _sysctl            | EPERM         | obsolete sysctl interface |
//	| bpf                | EPERM         | eBPF verifier is a large attack surface |
//	| perf_event_open    | EPERM         | host-wide profiling, frequent CVEs |
//	| lookup_dcookie     | EPERM         | kernel profiling internals |
//	| swapon             | EPERM         | host swap |
//	| swapoff            | EPERM         | host swap |
//	| reboot             | EPERM         | host (a pid ns turns it into kill, but deny anyway) |
//	| syslog             | EPERM         | host kernel log leaks addresses |
//	| acct               | EPERM         | host process accounting |
//	| quotactl           | EPERM         | host quotas |
//	| quotactl_fd        | EPERM         | host quotas |
//	| nfsservctl         | EPERM         | removed NFS server control |
//	| vhangup            | EPERM         | hangs up terminals |
//	| settimeofday       | EPERM         | the clock is not namespaced |
//	| clock_settime      | EPERM         | the clock is not namespaced |
//	| adjtimex           | EPERM         | the clock is not namespaced |
//	| clock_adjtime      | EPERM         | the clock is not namespaced |
//	| keyctl             | EPERM         | the kernel keyring is not namespaced |
//	| add_key            | EPERM         | the kernel keyring is not namespaced |
//	| request_key        | EPERM         | the kernel keyring is not namespaced |
//	| open_by_handle_at  | EPERM         | opens files by handle, bypassing the root ("shocker") |
//	| name_to_handle_at  | EPERM         | companion of open_by_handle_at |
//	| iopl               | EPERM         | raw port I/O |
//	| ioperm             | EPERM         | raw port I/O |
//	| setns              | EPERM         | joining other namespaces |
//	| io_uring_setup     | ENOSYS        | io_uring ops bypass seccomp; ENOSYS = kernel without it |
//	| io_uring_enter     | ENOSYS        | as above |
//	| io_uring_register  | ENOSYS        | as above |
//	| personality        | EPERM unless arg in {0, 0x8, 0x20000, 0x20008, 0xffffffff} | ADDR_NO_RANDOMIZE etc. weaken ASLR |
//	| ioctl              | see below     | |
//	| ptrace             | EPERM         | unless AllowPtrace |
//	| process_vm_readv   | EPERM         | unless AllowPtrace |
//	| process_vm_writev  | EPERM         | unless AllowPtrace |
//	| userfaultfd        | EPERM         | unless AllowUserfaultfd: stalls kernel page faults, a race-widening tool in exploits |
//	| clone              | EPERM if flags & CLONE_NEWUSER | unless AllowUserNS |
//	| unshare            | EPERM if flags & CLONE_NEWUSER | unless AllowUserNS |
//	| clone3             | ENOSYS        | unless AllowUserNS: flags are in memory seccomp cannot read; glibc falls back to clone |
//
// ioctl, by request number (low 32 bits of the second argument):
//
//	| request                               | action     | why |
//	|---------------------------------------|------------|-----|
//	| FICLONE 0x40049409                    | EOPNOTSUPP | shared extents escape per-sandbox disk accounting |
//	| FICLONERANGE 0x4020940d               | EOPNOTSUPP | as above |
//	| FIDEDUPERANGE 0xc0189436              | EOPNOTSUPP | as above |
//	| XFS_IOC_SWAPEXT 0xc0c0586d            | EOPNOTSUPP | swaps extents between files |
//	| XFS_IOC_EXCHANGE_RANGE 0x40285881     | EOPNOTSUPP | its successor (Linux 6.10) |
//	| TIOCSTI 0x5412                        | EPERM      | injects input into a terminal |
//	| TIOCLINUX 0x541c                      | EPERM      | virtual console injection/selection |
//	| anything else                         | allow      | |
//
// EOPNOTSUPP for the extent ioctls is what a file system without reflink
// answers, so cp --reflink=auto and similar tools fall back to copying.
//
// FS_IOC_SETFLAGS (chattr) stays allowed: images use it (chattr +C for
// databases, package scripts), and the flags that matter (immutable,
// append-only) need CAP_LINUX_IMMUTABLE, which the runtime must drop;
// otherwise an immutable file in the upper directory would make teardown
// fail.
//
// ptrace is denied by default even though sandbox processes are in their
// own pid namespace and could only trace each other: it is rarely needed
// by RL workloads and has a long CVE history; AllowPtrace turns it (and
// process_vm_readv/writev, which need the same permission) back on for
// debuggers, strace and profilers.
package seccomp
