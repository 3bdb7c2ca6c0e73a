// Init mode: PID 1 of a sandbox. Builds the root file system inside its own
// mount namespace, then only reaps children until it is killed.
#include "shim.h"

#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define FAIL(kind, ...)                                                        \
	do {                                                                   \
		report(FD_STATUS, kind, errno, __VA_ARGS__);                   \
		return 1;                                                      \
	} while (0)

// layer_ref opens path and returns "/proc/self/fd/N" for it: overlayfs
// shows its option strings in mountinfo, and these reveal nothing of the
// host's directory layout.
static int layer_ref(const char *path, char *out, size_t n) {
	int fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	snprintf(out, n, "/proc/self/fd/%d", fd);
	return fd;
}

// mount_overlay uses the new mount API so the number and length of lower
// layers is not limited by one page of mount options.
static int mount_overlay(char **lower, const char *upper, const char *work, const char *target) {
	int fs = fsopen("overlay", FSOPEN_CLOEXEC);
	if (fs < 0)
		return -1;
	int ok = 0, fds[3], nfd = 0;
	char ref[64];
	for (char **l = lower; *l && ok == 0; l++) {
		int fd = layer_ref(*l, ref, sizeof ref);
		ok = fd < 0 ? -1 : fsconfig(fs, FSCONFIG_SET_STRING, "lowerdir+", ref, 0);
		if (fd >= 0)
			close(fd); // the layer is held by the fs context now
	}
	if (ok == 0 && upper) {
		if ((fds[nfd] = layer_ref(upper, ref, sizeof ref)) < 0)
			ok = -1;
		else
			ok = fsconfig(fs, FSCONFIG_SET_STRING, "upperdir", ref, 0), nfd++;
		if (ok == 0 && (fds[nfd] = layer_ref(work, ref, sizeof ref)) < 0)
			ok = -1;
		else if (ok == 0)
			ok = fsconfig(fs, FSCONFIG_SET_STRING, "workdir", ref, 0), nfd++;
	}
	// volatile: no syncfs of the host file system when the overlay goes
	// away or the sandbox calls sync/fsync. A sandbox does not survive a
	// host crash anyway, and a sync per teardown costs a journal commit.
	if (ok == 0 && upper)
		ok = fsconfig(fs, FSCONFIG_SET_FLAG, "volatile", NULL, 0);
	if (ok == 0)
		ok = fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0);
	int mnt = -1;
	// nodev: root in the sandbox has CAP_MKNOD (docker's set), and a node
	// it makes must not open a host device (another sandbox's loop disk,
	// the host's console).
	if (ok == 0)
		mnt = fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NODEV);
	if (mnt >= 0)
		ok = move_mount(mnt, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH);
	else
		ok = -1;
	int e = errno;
	close(fs);
	if (mnt >= 0)
		close(mnt);
	for (int i = 0; i < nfd; i++)
		close(fds[i]);
	errno = e;
	return ok;
}

static void mkdir_p1(const char *p, mode_t m) {
	if (mkdir(p, m) < 0 && errno != EEXIST)
		return;
}

static const char *nodes[] = {
	"dev/null", "dev/zero", "dev/full", "dev/random", "dev/urandom", "dev/tty",
};

// The sandbox's memory-backed directories (/dev, /dev/shm, /tmp and the
// empty directory shown over masked paths) are directories of one tmpfs,
// sized for all of them: each superblock costs every memory cgroup on the
// host a shrinker slot (kernel memory that grows with the host's peak
// superblock count, so with the sandboxes held) and makes each memory
// cgroup's teardown walk more lists. The tmpfs is mounted on tmp to make
// the directories, each is cloned as a detached mount of its own, and the
// staging mount goes away before they are moved into place.
enum { RUN_DEV, RUN_SHM, RUN_TMP, RUN_MASK, RUN_N };

static int run_tmpfs(long long size, int fds[RUN_N]) {
	static const char *dirs[RUN_N] = {"tmp/dev", "tmp/shm", "tmp/tmp", "tmp/mask"};
	static const mode_t modes[RUN_N] = {0755, 01777, 01777, 0555};
	char opt[64];
	snprintf(opt, sizeof opt, "mode=755,size=%lld", size);
	if (mount("tmpfs", "tmp", "tmpfs", MS_NOSUID | MS_NODEV, opt))
		return -1;
	for (int i = 0; i < RUN_N; i++) {
		if (mkdir(dirs[i], modes[i]))
			return -1;
		fds[i] = open_tree(AT_FDCWD, dirs[i], OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
		if (fds[i] < 0)
			return -1;
	}
	return umount2("tmp", MNT_DETACH);
}

static int move_to(int fd, const char *target) {
	int r = move_mount(fd, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH);
	int e = errno;
	close(fd);
	errno = e;
	return r;
}

static int setup_dev(int devfd, int shmfd) {
	// nodev, as the root (see mount_overlay); the standard nodes are bind
	// mounts of the host's, which keep their own mount's flags.
	if (move_to(devfd, "dev"))
		return -1;
	for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++) {
		int fd = open(nodes[i], O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
		if (fd < 0)
			return -1;
		close(fd);
		char host[64];
		snprintf(host, sizeof host, "/%s", nodes[i]);
		if (mount(host, nodes[i], NULL, MS_BIND, NULL))
			return -1;
	}
	mkdir_p1("dev/pts", 0755);
	mkdir_p1("dev/shm", 01777);
	if (mount("devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
		  "newinstance,ptmxmode=0666,mode=0620,gid=5"))
		return -1;
	if (move_to(shmfd, "dev/shm"))
		return -1;
	if (symlink("pts/ptmx", "dev/ptmx") || symlink("/proc/self/fd", "dev/fd") ||
	    symlink("/proc/self/fd/0", "dev/stdin") || symlink("/proc/self/fd/1", "dev/stdout") ||
	    symlink("/proc/self/fd/2", "dev/stderr"))
		return -1;
	return 0;
}

// Paths hidden from the sandbox (as docker does): files get /dev/null bound
// over them, directories an empty read-only tmpfs.
static const char *masked[] = {
	"proc/kcore",       "proc/keys",        "proc/timer_list",   "proc/sched_debug",
	"proc/kpagecgroup", "proc/kpageflags",  "proc/kpagecount",   "proc/latency_stats",
	"proc/timer_stats", "proc/acpi",        "proc/scsi",         "proc/asound",
	"sys/firmware",     "sys/devices/virtual/powercap",
	// Loop devices (sandbox disks among them) name their backing files
	// here: the host's data dir and every other sandbox's ID.
	"sys/devices/virtual/block",
	// Reading hot_add allocates a new zram device on the host: a recursive
	// grep over /sys would create one per read.
	"sys/class/zram-control", NULL,
};

static const char *readonly[] = {
	"proc/bus", "proc/fs", "proc/irq", "proc/sys", "proc/sysrq-trigger", NULL,
};

// mask_paths hides the masked paths: every masked directory shows the same
// empty read-only directory (maskfd, a mount of run_tmpfs's "mask"; the
// first gets it, the others bind mounts of the first).
static int mask_paths(int maskfd) {
	const char *empty = NULL;
	for (const char **p = masked; *p; p++) {
		struct stat st;
		if (lstat(*p, &st) < 0)
			continue; // not on this kernel
		if (!S_ISDIR(st.st_mode)) {
			if (mount("dev/null", *p, NULL, MS_BIND, NULL))
				return -1;
		} else if (empty) {
			if (mount(empty, *p, NULL, MS_BIND, NULL))
				return -1;
		} else {
			int r = move_to(maskfd, *p);
			maskfd = -1;
			if (r || mount(NULL, *p, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
				return -1;
			empty = *p;
		}
	}
	if (maskfd >= 0)
		close(maskfd); // nothing to mask on this kernel
	for (const char **p = readonly; *p; p++) {
		if (access(*p, F_OK) < 0)
			continue;
		if (mount(*p, *p, NULL, MS_BIND | MS_REC, NULL) ||
		    mount(NULL, *p, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
			return -1;
	}
	return 0;
}

static int loopback_up(void) {
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -1;
	struct ifreq ifr;
	memset(&ifr, 0, sizeof ifr);
	strcpy(ifr.ifr_name, "lo");
	int r = ioctl(s, SIOCGIFFLAGS, &ifr);
	if (r == 0 && !(ifr.ifr_flags & IFF_UP)) {
		ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
		r = ioctl(s, SIOCSIFFLAGS, &ifr);
	}
	int e = errno;
	close(s);
	errno = e;
	return r;
}

int shim_init(void) {
	struct cfg c;
	umask(0);
	if (cfg_read(FD_CONFIG, &c))
		FAIL("invalid", "read config");
	// The Go side puts us into the sandbox cgroup, then lets us go on.
	char b;
	if (read(FD_AUX, &b, 1) != 1)
		FAIL("internal", "sync pipe closed");

	const char *netns = cfg_get(&c, T_NETNS);
	if (netns) {
		int fd = open(netns, O_RDONLY | O_CLOEXEC);
		if (fd < 0 || setns(fd, CLONE_NEWNET))
			FAIL("invalid", "join network namespace %s", netns);
		close(fd);
	}
	// Done after joining the cgroup so its root is the sandbox's group.
	if (unshare(CLONE_NEWCGROUP))
		FAIL("internal", "unshare cgroup namespace");
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL))
		FAIL("internal", "make / private");

	const char *upper = cfg_get(&c, T_UPPER), *work = cfg_get(&c, T_WORK);
	const char *diskdev = cfg_get(&c, T_DISKDEV), *diskdir = cfg_get(&c, T_DISKDIR);
	int diskfd = -1;
	char dupper[4096], dwork[4096];
	if (diskdev) {
		const char *fstype = cfg_get(&c, T_DISKFSTYPE);
		if (mount(diskdev, diskdir, fstype ? fstype : "ext4", MS_NOSUID | MS_NODEV | MS_NOATIME, NULL))
			FAIL("internal", "mount disk %s", diskdev);
		snprintf(dupper, sizeof dupper, "%s/upper", diskdir);
		snprintf(dwork, sizeof dwork, "%s/work", diskdir);
		mkdir_p1(dupper, 0755);
		mkdir_p1(dwork, 0700);
		upper = dupper;
		work = dwork;
		// Kept open (as fd 3) so the host reaches the upper layer through
		// /proc/<pid>/fd/3 although the disk is mounted only in here.
		diskfd = open(diskdir, O_PATH | O_DIRECTORY | O_CLOEXEC);
		if (diskfd < 0)
			FAIL("internal", "open disk root");
	}
	char **lower;
	if (cfg_all(&c, T_LOWER, &lower) < 1)
		FAIL("invalid", "no lower layers");
	const char *root = cfg_get(&c, T_ROOT);
	if (!root)
		FAIL("invalid", "no root");
	if (mount_overlay(lower, upper, work, root))
		FAIL("internal", "mount overlay on %s", root);
	if (chdir(root))
		FAIL("internal", "chdir root");

	mkdir_p1("proc", 0555);
	mkdir_p1("dev", 0755);
	mkdir_p1("sys", 0555);
	mkdir_p1("tmp", 01777);
	if (mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
		FAIL("internal", "mount /proc");
	// /dev's own files take a few kB; /tmp and /dev/shm share the rest.
	int run[RUN_N];
	if (run_tmpfs(cfg_int(&c, T_TMPSIZE, 256 << 20) + cfg_int(&c, T_SHMSIZE, 64 << 20) + (64 << 10), run))
		FAIL("internal", "mount the sandbox's tmpfs");
	if (setup_dev(run[RUN_DEV], run[RUN_SHM]))
		FAIL("internal", "set up /dev");
	// A sandbox with a loopback-only network namespace binds the node's
	// shared read-only sysfs (of a namespace that also holds only lo): a
	// new sysfs mount makes the kernel compare it with every sysfs
	// superblock on the host, which grows with the sandboxes held.
	const char *sysfs = cfg_get(&c, T_SYSFS);
	if (sysfs ? mount(sysfs, "sys", NULL, MS_BIND, NULL) ||
			    mount(NULL, "sys", NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL)
		  : mount("sysfs", "sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
		FAIL("internal", "mount /sys");
	if (mask_paths(run[RUN_MASK]))
		FAIL("internal", "mask /proc paths");
	if (move_to(run[RUN_TMP], "tmp"))
		FAIL("internal", "mount /tmp");

	const char *host = cfg_get(&c, T_HOSTNAME);
	if (host && sethostname(host, strlen(host)))
		FAIL("internal", "sethostname");
	if (syscall(SYS_pivot_root, ".", "."))
		FAIL("internal", "pivot_root");
	if (umount2(".", MNT_DETACH))
		FAIL("internal", "detach old root");
	if (chdir("/"))
		FAIL("internal", "chdir /");
	if (loopback_up())
		FAIL("internal", "bring up lo");

	// The init must outlive whatever the sandbox runs when memory is short.
	write_file("/proc/self/oom_score_adj", "-999");
	prctl(PR_SET_NAME, "init", 0, 0, 0);

	int null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null < 0)
		FAIL("internal", "open /dev/null");
	for (int fd = 0; fd < 3; fd++)
		dup2(null, fd);
	if (diskfd >= 0) {
		if (dup3(diskfd, FD_CONFIG, O_CLOEXEC) < 0)
			FAIL("internal", "keep disk fd");
	} else {
		close(FD_CONFIG);
	}

	if (apply_caps(strtoull(cfg_get(&c, T_CAPS) ? cfg_get(&c, T_CAPS) : "0", NULL, 10), 1))
		FAIL("internal", "drop capabilities");
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
		FAIL("internal", "no_new_privs");
	// Non-dumpable: /proc/1/{exe,environ,fd,mem} stay closed to the sandbox.
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0))
		FAIL("internal", "set non-dumpable");
	sigset_t all, chld;
	sigfillset(&all);
	sigprocmask(SIG_BLOCK, &all, NULL);
	if (apply_seccomp(cfg_rec(&c, T_SECCOMP)))
		FAIL("invalid", "install seccomp filter");

	// Nothing of dsec may stay behind in our memory image.
	for (char **e = environ; e && *e; e++)
		memset(*e, 0, strlen(*e));
	environ = NULL;
	write_all(FD_STATUS, "ok\n", 3);
	syscall(SYS_close_range, diskfd >= 0 ? FD_CONFIG + 1 : FD_CONFIG, ~0U, 0);

	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	for (;;) {
		siginfo_t si;
		if (sigwaitinfo(&chld, &si) < 0 && errno != EINTR)
			pause();
		while (waitpid(-1, NULL, WNOHANG) > 0)
			;
	}
}
