// Spawner mode: a fork server. The runtime starts it once (exec of the dsec
// binary with _DSEC_SHIM=spawner) and then asks it over a SOCK_SEQPACKET
// socket on fd 3 for every init and exec shim. A child forked from this
// small, already started C process skips what an exec of the 25 MB binary
// costs each time: the exec, its page faults and libc's static start-up
// (CPU feature and cache detection: dozens of CPUID instructions, each a
// VM exit on a virtual machine).
//
// Request: struct spawn_req plus nfds descriptors (SCM_RIGHTS) in the order
// the child gets them: stdin, stdout, stderr, config, status, aux. Reply:
// struct spawn_rep plus the child's pidfd (SCM_RIGHTS) when pid > 0.
//
// A child does nothing before the spawner has sent its reply: it waits for
// one byte on a pipe the spawner writes only after the reply went out. If
// the spawner dies between clone and reply, the child exits untouched and
// the runtime can safely ask again.
#include "shim.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

// Namespaces a request may ask for.
#define SPAWN_NSFLAGS                                                          \
	((uint64_t)(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC | \
		    CLONE_NEWNET | CLONE_NEWCGROUP))

static int g_argc;
static char **g_argv;
// Tests: a file whose removal makes the spawner die between a clone and
// its reply (once).
static const char *g_die_flag;
// Signals whose disposition in the spawner is not SIG_DFL (it changes none
// after start-up): all a child has to reset.
static int g_nondfl[NSIG], g_nnondfl;

// set_cmdline overwrites our argv strings (inherited from the spawner) with
// name, so /proc/<pid>/cmdline shows name and nothing of the spawner's. The
// runtime starts the spawner with an argument area exactly as long as the
// names of the modes; were it longer, the kernel's end of the area would
// have to move (CAP_SYS_RESOURCE, tried) or cmdline would show trailing
// NUL bytes.
static void set_cmdline(const char *name) {
	if (g_argc < 1 || !g_argv || !g_argv[0])
		return;
	char *start = g_argv[0];
	char *end = g_argv[g_argc - 1] + strlen(g_argv[g_argc - 1]) + 1;
	size_t n = strlen(name) + 1;
	if ((size_t)(end - start) < n)
		return;
	memset(start, 0, (size_t)(end - start));
	memcpy(start, name, n);
	if ((size_t)(end - start) > n)
		prctl(PR_SET_MM, PR_SET_MM_ARG_END, (unsigned long)(start + n), 0UL, 0UL);
}

// The kernel's sigaction: libc's wrapper refuses the signals libc keeps for
// itself (32 and 33 in glibc), which a parent may still have left ignored.
struct ksigaction {
	void (*handler)(int);
	unsigned long flags;
	void (*restorer)(void);
	uint64_t mask;
};

static int raw_sigaction(int sig, const struct ksigaction *act, struct ksigaction *old) {
	return (int)syscall(SYS_rt_sigaction, sig, act, old, sizeof(uint64_t));
}

// child runs in the new process: it becomes what a fresh exec of the shim
// in mode would have been, then runs that mode. Never returns. go is the
// read end of the pipe on which the spawner says go, gow its write end.
static void child(uint32_t mode, const int *fds, int nfds, int go, int gow) {
	// Only the spawner may hold its socket and the write end of the go
	// pipe: if it dies, the runtime reads EOF and this child reads EOF.
	close(FD_SPAWNER);
	close(gow);
	struct ksigaction dfl = {0};
	dfl.handler = SIG_DFL;
	for (int i = 0; i < g_nnondfl; i++)
		raw_sigaction(g_nondfl[i], &dfl, NULL);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);

	setsid();
	// Received descriptors become exactly 0..nfds-1: first out of the way
	// (above every target), then down; dup2 clears close-on-exec. All
	// others are closed but go.
	if (go < nfds && (go = fcntl(go, F_DUPFD_CLOEXEC, nfds)) < 0)
		_exit(122);
	int tmp[SPAWN_MAXFDS];
	for (int i = 0; i < nfds; i++)
		if ((tmp[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, nfds)) < 0)
			_exit(122);
	for (int i = 0; i < nfds; i++)
		if (dup2(tmp[i], i) < 0)
			_exit(122);
	if (go > nfds)
		syscall(SYS_close_range, (unsigned)nfds, (unsigned)go - 1, 0);
	syscall(SYS_close_range, (unsigned)go + 1, ~0U, 0);

	// Up to here nothing outside this process changed. The spawner has
	// usually written the go byte by now.
	char b;
	ssize_t r;
	do
		r = read(go, &b, 1);
	while (r < 0 && errno == EINTR);
	if (r != 1)
		_exit(121); // the spawner died before it answered: the runtime retries
	close(go);

	if (mode == SPAWN_INIT) {
		// The sandbox sees PID 1 as "init", as when it was exec'd so; the
		// init wipes its environment itself.
		set_cmdline("init");
		prctl(PR_SET_NAME, "init", 0, 0, 0);
		_exit(shim_init());
	}
	set_cmdline("exec");
	prctl(PR_SET_NAME, "dsec-exec", 0, 0, 0);
	_exit(shim_exec());
}

static int reply(int sock, int32_t pid, int32_t err, int pidfd) {
	struct spawn_rep rep = {pid, err};
	struct iovec iov = {&rep, sizeof rep};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct msghdr m;
	memset(&m, 0, sizeof m);
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	if (pidfd >= 0) {
		memset(&u, 0, sizeof u);
		m.msg_control = u.buf;
		m.msg_controllen = sizeof u.buf;
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &pidfd, sizeof(int));
	}
	ssize_t n;
	do
		n = sendmsg(sock, &m, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	return n == (ssize_t)sizeof rep ? 0 : -1;
}

static void close_all(const int *fds, int n) {
	for (int i = 0; i < n; i++)
		close(fds[i]);
}

// serve_one reads one request and answers it. Returns -1 when the socket
// is closed (the runtime went away) or broken.
static int serve_one(int sock) {
	struct spawn_req req;
	struct iovec iov = {&req, sizeof req};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int) * (SPAWN_MAXFDS + 2))];
	} u;
	struct msghdr m;
	memset(&m, 0, sizeof m);
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	m.msg_control = u.buf;
	m.msg_controllen = sizeof u.buf;
	ssize_t n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
	if (n < 0)
		return errno == EINTR || errno == EAGAIN ? 0 : -1;
	if (n == 0)
		return -1;
	int fds[SPAWN_MAXFDS + 2], nfds = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		for (int i = 0; i < k && nfds < SPAWN_MAXFDS + 2; i++)
			memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
	}
	if (n != (ssize_t)sizeof req || (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ||
	    (req.mode != SPAWN_INIT && req.mode != SPAWN_EXEC) || req.nfds != (uint32_t)nfds ||
	    nfds < FD_STATUS + 1 || nfds > SPAWN_MAXFDS || (req.flags & ~SPAWN_NSFLAGS)) {
		close_all(fds, nfds);
		return reply(sock, -1, EINVAL, -1);
	}

	int go[2];
	if (pipe2(go, O_CLOEXEC)) {
		int e = errno;
		close_all(fds, nfds);
		return reply(sock, -1, e, -1);
	}
	int pidfd = -1;
	struct clone_args ca;
	memset(&ca, 0, sizeof ca);
	ca.flags = CLONE_PIDFD | req.flags;
	ca.pidfd = (uint64_t)(uintptr_t)&pidfd;
	ca.exit_signal = SIGCHLD;
	long pid = syscall(SYS_clone3, &ca, sizeof ca);
	if (pid == 0)
		child(req.mode, fds, nfds, go[0], go[1]);
	if (pid > 0 && g_die_flag && unlink(g_die_flag) == 0)
		_exit(1);
	int e = pid < 0 ? errno : 0;
	close(go[0]);
	close_all(fds, nfds);
	int r = reply(sock, pid < 0 ? -1 : (int32_t)pid, e, pidfd);
	// The child starts only once the runtime has its pid and pidfd; without
	// them (reply failed) it exits on EOF.
	if (r == 0 && pid > 0)
		write(go[1], "g", 1);
	close(go[1]);
	if (pidfd >= 0)
		close(pidfd);
	return r;
}

int shim_spawner(int argc, char **argv) {
	g_argc = argc;
	g_argv = argv;
	g_die_flag = getenv("_DSEC_SPAWNER_TEST_DIE");
	prctl(PR_SET_NAME, "dsec-spawner", 0, 0, 0);
	// A child that died before reading its go byte must not kill us.
	signal(SIGPIPE, SIG_IGN);
	for (int s = 1; s <= 64; s++) {
		struct ksigaction sa;
		if (raw_sigaction(s, NULL, &sa) == 0 && sa.handler != SIG_DFL)
			g_nondfl[g_nnondfl++] = s;
	}
	sigset_t chld;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, NULL);
	int sfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
	if (sfd < 0)
		return 1;
	fcntl(FD_SPAWNER, F_SETFD, FD_CLOEXEC);
	// Reaping: waitpid(-1) walks every child (every sandbox's init), so a
	// SIGCHLD reaps the child it names; SIGCHLDs that arrive together are
	// merged into one, and a sweep of all children, at most once a second,
	// reaps those.
	struct timespec last_sweep = {0, 0};
	int missed = 0;
	for (;;) {
		struct pollfd pf[2] = {{FD_SPAWNER, POLLIN, 0}, {sfd, POLLIN, 0}};
		if (poll(pf, 2, missed ? 1000 : -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (pf[1].revents) {
			struct signalfd_siginfo si;
			while (read(sfd, &si, sizeof si) > 0) {
				if (si.ssi_pid > 0)
					waitpid((pid_t)si.ssi_pid, NULL, WNOHANG);
				missed = 1; // others may have ended with it
			}
		}
		struct timespec now;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (missed && now.tv_sec - last_sweep.tv_sec >= 1) {
			while (waitpid(-1, NULL, WNOHANG) > 0)
				;
			missed = 0;
			last_sweep = now;
		}
		if (pf[0].revents && serve_one(FD_SPAWNER) < 0)
			break;
	}
	// Children that run on are reparented; those that ended are reaped.
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
	return 0;
}
