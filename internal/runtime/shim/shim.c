// Entry point and helpers shared by the init and exec modes.
#include "shim.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int write_all(int fd, const void *buf, size_t n) {
	const char *p = buf;
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

// report writes one status line "err <kind> <errno> <message>\n" for the
// Go side, which maps kind to an error class.
void report(int fd, const char *kind, int err, const char *fmt, ...) {
	char msg[1024], line[1200];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	for (char *p = msg; *p; p++)
		if (*p == '\n')
			*p = ' ';
	int n = snprintf(line, sizeof line, "err %s %d %s\n", kind, err, msg);
	if (n > (int)sizeof line - 1)
		n = sizeof line - 1;
	write_all(fd, line, (size_t)n);
}

int write_file(const char *path, const char *val) {
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	int r = write_all(fd, val, strlen(val));
	int e = errno;
	close(fd);
	errno = e;
	return r;
}

// cfg_read reads length-prefixed records until EOF:
// tag (1 byte), length (4 bytes little endian), value, one NUL byte.
int cfg_read(int fd, struct cfg *c) {
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap);
	if (!buf)
		return -1;
	for (;;) {
		if (len == cap) {
			cap *= 2;
			char *nb = realloc(buf, cap);
			if (!nb)
				return -1;
			buf = nb;
		}
		ssize_t r = read(fd, buf + len, cap - len);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		if (r == 0)
			break;
		len += (size_t)r;
	}
	int n = 0;
	for (size_t off = 0; off + 5 <= len;) {
		uint32_t l;
		memcpy(&l, buf + off + 1, 4);
		off += 5 + (size_t)l + 1;
		n++;
	}
	c->r = calloc((size_t)n + 1, sizeof(struct rec));
	if (!c->r)
		return -1;
	c->n = 0;
	for (size_t off = 0; off + 5 <= len;) {
		struct rec *r = &c->r[c->n];
		uint32_t l;
		r->tag = (unsigned char)buf[off];
		memcpy(&l, buf + off + 1, 4);
		if (off + 5 + (size_t)l + 1 > len) {
			errno = EINVAL;
			return -1;
		}
		r->len = l;
		r->val = buf + off + 5;
		r->val[l] = 0;
		off += 5 + (size_t)l + 1;
		c->n++;
	}
	return 0;
}

const struct rec *cfg_rec(const struct cfg *c, int tag) {
	for (int i = 0; i < c->n; i++)
		if (c->r[i].tag == tag)
			return &c->r[i];
	return NULL;
}

const char *cfg_get(const struct cfg *c, int tag) {
	const struct rec *r = cfg_rec(c, tag);
	return r ? r->val : NULL;
}

long long cfg_int(const struct cfg *c, int tag, long long def) {
	const char *v = cfg_get(c, tag);
	return v ? strtoll(v, NULL, 10) : def;
}

// cfg_all returns a NULL-terminated array of every value with tag.
int cfg_all(const struct cfg *c, int tag, char ***out) {
	int n = 0;
	for (int i = 0; i < c->n; i++)
		n += c->r[i].tag == tag;
	char **v = calloc((size_t)n + 1, sizeof(char *));
	if (!v)
		return -1;
	n = 0;
	for (int i = 0; i < c->n; i++)
		if (c->r[i].tag == tag)
			v[n++] = c->r[i].val;
	*out = v;
	return n;
}

// apply_caps drops every capability not in keep from the bounding set and,
// when set_sets, makes keep the effective and permitted sets (inheritable and
// ambient empty).
int apply_caps(uint64_t keep, int set_sets) {
	for (int c = 0; c < 64; c++) {
		if (prctl(PR_CAPBSET_READ, c, 0, 0, 0) < 0)
			break; // past CAP_LAST_CAP
		if (keep & (1ULL << c))
			continue;
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0)
			return -1;
	}
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
		return -1;
	if (!set_sets)
		return 0;
	struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct d[2];
	memset(d, 0, sizeof d);
	d[0].effective = d[0].permitted = (uint32_t)keep;
	d[1].effective = d[1].permitted = (uint32_t)(keep >> 32);
	return (int)syscall(SYS_capset, &h, d);
}

// apply_seccomp installs a raw classic BPF program (struct sock_filter[]).
int apply_seccomp(const struct rec *filter) {
	if (!filter || filter->len == 0)
		return 0;
	if (filter->len % sizeof(struct sock_filter)) {
		errno = EINVAL;
		return -1;
	}
	struct sock_filter *prog = malloc(filter->len);
	if (!prog)
		return -1;
	memcpy(prog, filter->val, filter->len); // the record may be unaligned
	struct sock_fprog fp = {(unsigned short)(filter->len / sizeof(struct sock_filter)), prog};
	return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fp);
}

// dsec_shim_entry runs before the Go runtime when the process was started
// as a shim; it never returns to Go in that case. libc passes main's
// arguments to constructors; the spawner keeps argv so that its children
// can overwrite the argument area (their /proc/PID/cmdline).
__attribute__((constructor)) static void dsec_shim_entry(int argc, char **argv, char **envp) {
	(void)envp;
	const char *m = getenv("_DSEC_SHIM");
	if (!m)
		return;
	if (strcmp(m, "init") == 0)
		_exit(shim_init());
	if (strcmp(m, "exec") == 0)
		_exit(shim_exec());
	if (strcmp(m, "spawner") == 0)
		_exit(shim_spawner(argc, argv));
	_exit(120);
}
