// Shared declarations of the dsec shim (see doc.go). The shim runs in a
// constructor before the Go runtime starts, so it must only use libc.
#ifndef DSEC_SHIM_H
#define DSEC_SHIM_H

#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>

// Config record tags; keep in sync with shim.go.
enum {
	T_HOSTNAME = 1,
	T_LOWER = 2,
	T_UPPER = 3,
	T_WORK = 4,
	T_ROOT = 5,
	T_DISKDEV = 6,
	T_DISKDIR = 7,
	T_NETNS = 8,
	T_TMPSIZE = 9,
	T_SHMSIZE = 10,
	T_SECCOMP = 11,
	T_CAPS = 12,
	T_EXECID = 13,
	T_EXECDIR = 14,
	T_ARG = 15,
	T_ENV = 16,
	T_CWD = 17,
	T_USER = 18,
	T_TIMEOUTMS = 19,
	T_OUTCAP = 20,
	T_CGROUP = 21,
	T_DISKFSTYPE = 22,
	T_TTYROOT = 23,
	T_SYSFS = 24,
	T_RECORD = 25,
};

// Fixed descriptors handed over by the Go side.
enum {
	FD_CONFIG = 3,
	FD_STATUS = 4,
	FD_AUX = 5, // init: sync pipe (read); exec: pidfd of the sandbox init
	FD_SPAWNER = 3, // spawner: its socket to the runtime
};

// Spawner protocol (see spawner.c); keep in sync with shim.go. One request
// carries the descriptors a child gets as 0..nfds-1 (SCM_RIGHTS); one reply
// carries the child's pidfd when pid > 0.
enum {
	SPAWN_INIT = 1,
	SPAWN_EXEC = 2,
	SPAWN_MAXFDS = 6,
};

struct spawn_req {
	uint32_t mode;  // SPAWN_INIT or SPAWN_EXEC
	uint32_t nfds;  // descriptors attached
	uint64_t flags; // CLONE_NEW* flags of the child
};

struct spawn_rep {
	int32_t pid; // host pid of the child, -1 on failure
	int32_t err; // errno of the failure
};

struct rec {
	int tag;
	uint32_t len;
	char *val; // NUL-terminated by the encoder
};

struct cfg {
	struct rec *r;
	int n;
};

int cfg_read(int fd, struct cfg *c);
const char *cfg_get(const struct cfg *c, int tag);
const struct rec *cfg_rec(const struct cfg *c, int tag);
int cfg_all(const struct cfg *c, int tag, char ***out);
long long cfg_int(const struct cfg *c, int tag, long long def);

int write_all(int fd, const void *buf, size_t n);
void report(int fd, const char *kind, int err, const char *fmt, ...);
int apply_caps(uint64_t keep, int set_sets);
int apply_seccomp(const struct rec *filter);
int write_file(const char *path, const char *val);

int shim_init(void);
int shim_exec(void);
int shim_spawner(int argc, char **argv);

#endif
