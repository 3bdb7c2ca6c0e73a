// Package runtime starts and runs sandboxes: namespaces, an overlay root, a
// tiny init as PID 1, exec of processes inside, freeze/thaw and teardown.
// It is mechanism only: no quotas, placement or policy. Runtime is the
// interface; NamespaceRuntime implements it with Linux namespaces (a
// micro-VM runtime can implement the same interface on hosts with KVM).
//
// # Processes
//
// Neither the init nor the exec helper is a Go program: both are the C shim
// of package shim, linked into the dsec binary and started as
// /proc/self/exe with _DSEC_SHIM set, so it runs from an ELF constructor
// before the Go runtime exists. An idle sandbox then costs ~100 kB of
// private memory for its init instead of ~1 MB for a Go init, and an exec
// does not pay the Go runtime's start-up.
//
// Spawner: shims are forked, not exec'd. The runtime starts one spawner
// lazily (the binary again, _DSEC_SHIM=spawner: a C loop in the same
// constructor) in its own session with a SOCK_SEQPACKET socket as fd 3, and
// asks it for every init and exec shim: a request carries the mode, the
// clone flags and the shim's descriptors (SCM_RIGHTS, in fd order); the
// spawner clone3s (CLONE_PIDFD and the namespaces) and answers with the pid
// and the pidfd, which the runtime holds as it held its own children's. The
// child resets its signal dispositions and mask, calls setsid, moves the
// descriptors to 0..5, closes the rest and runs the mode as an exec'd shim
// would. A fork of the started C process skips the exec of the 25 MB binary,
// its page faults and static glibc's start-up (CPU feature and cache
// detection: dozens of CPUID exits on a VM, ~0.9 ms per shim), and an idle
// init shares most of its pages with the spawner. The child runs only once
// the spawner has sent the reply, so a request the spawner died on started
// nothing: it is repeated once on a new spawner, and if none works startShim
// forks and execs the shim itself (logged once). The spawner reaps its
// children (the runtime waits on pidfds and never sees their exit status)
// and exits when its socket closes (Close, or the server dies); inits and
// exec shims outlive it as they outlive the server. Its argv ("dsec") is
// exactly as long as "init" and "exec", which a child writes over it, so the
// sandbox's /proc/1/cmdline reads "init".
//
// Create: rootfs.Prepare makes the sandbox dir (upper and work, or a disk
// image on a loop device), the cgroup is created, and the init is started
// with clone flags NEWNS|NEWPID|NEWUTS|NEWIPC (+NEWNET unless a prepared
// netns is joined) and its own session. It waits on a sync pipe until it is
// in its cgroup, then unshares its cgroup namespace, mounts the overlay on
// the sandbox dir inside its private mount namespace (nothing is added to
// the host's mount table; layers are named by /proc/self/fd paths so the
// sandbox's mountinfo shows nothing of the host's layout), builds /dev,
// /proc (with masked and read-only paths), /sys (read-only) and /tmp,
// pivots, brings lo up, drops capabilities, sets no_new_privs, becomes
// non-dumpable, installs the seccomp filter, wipes its environment, closes
// every inherited descriptor and reports ready. Then it only reaps.
//
// Exec: an exec shim is started (forked by the spawner) with the init's
// pidfd. It joins the
// sandbox's cgroup and pid namespace, forks the process (which joins the
// other namespaces, switches user, drops capabilities and installs seccomp
// last), and pumps stdout and stderr both to the server and into capped
// log files under <Dir>/execs/<execID>/ (the tail is kept by rotating two
// halves). It kills the process group at the timeout and writes
// result.json when the process ends. Shims and inits are in their own
// sessions with no parent-death signal: they outlive the server, which
// re-attaches with Adopt and reads results with ExecResult.
//
// The overlay is mounted with "volatile": the sandbox's sync and fsync
// calls, and the unmount at teardown, do not sync the host's file system
// (a sandbox does not survive a host crash anyway; the sync made teardown
// ~2x slower here). Snapshots read the upper while the sandbox runs and
// must make their own copy durable.
//
// Waiting uses pidfds registered with Go's poller, so thousands of idle
// sandboxes do not hold thousands of threads in wait4.
//
// Destroy kills PID 1 (the kernel then kills the whole pid namespace; its
// mounts and a disk's loop device go with the last reference), kills what
// is left in the cgroup (exec shims), deletes the cgroup and the dir.
//
// Disk limits: see package rootfs. DiskBytes == 0 means no separate file
// system: the upper lives on the data dir's file system.
//
// Process.Tty gives the process a pty from the sandbox's own devpts
// instance (80x24; stdout and stderr merged onto Stdout, stdin copied in by
// the shim).
package runtime
