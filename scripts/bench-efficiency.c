/* bench-efficiency.c: the workloads scripts/bench-efficiency.sh runs inside
 * sandboxes. Static, libc only, so it runs in the busybox test rootfs.
 *
 *   effbench touch MB        allocate MB MiB, write every byte (a pattern
 *                            lzo compresses about 3:1, like a heap), then sleep
 *   effbench duty PCT MB     hold MB MiB touched, then burn PCT% of one core
 *                            in 100 ms periods, forever
 *   effbench spin            burn a core forever
 *   effbench probe N WORK_US SLEEP_US
 *                            N requests of WORK_US of CPU work each, SLEEP_US
 *                            apart; prints p50/p90/p99/max latency in us
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* keep makes the touched memory observable, so the compiler cannot drop
 * the allocation and the writes. */
static unsigned char *volatile keep;

static unsigned char *touch(size_t mb) {
	size_t n = mb << 20;
	unsigned char *p = malloc(n ? n : 1);
	if (!p) { perror("malloc"); exit(1); }
	for (size_t i = 0; i < n; i++) p[i] = (unsigned char)((i * 2654435761u) >> 13);
	keep = p;
	return p;
}

static volatile uint64_t sink;

/* work spins for about us microseconds of CPU, measured on the thread's CPU
 * clock, so preemption shows as wall-time latency, not as less work. */
static void work(uint64_t us) {
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	uint64_t start = (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec, x = sink;
	for (;;) {
		for (int i = 0; i < 1000; i++) x = x * 6364136223846793005ull + 1442695040888963407ull;
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
		if ((uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec - start >= us * 1000) break;
	}
	sink = x;
}

static int cmp(const void *a, const void *b) {
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
	if (argc >= 3 && !strcmp(argv[1], "touch")) {
		touch((size_t)atoi(argv[2]));
		printf("touched %s MiB\n", argv[2]);
		fflush(stdout);
		for (;;) pause();
	}
	if (argc >= 4 && !strcmp(argv[1], "duty")) {
		int pct = atoi(argv[2]);
		touch((size_t)atoi(argv[3]));
		for (;;) {
			work((uint64_t)pct * 1000);
			usleep((useconds_t)(100 - pct) * 1000);
		}
	}
	if (argc >= 2 && !strcmp(argv[1], "spin")) {
		for (;;) work(1000000);
	}
	if (argc >= 5 && !strcmp(argv[1], "probe")) {
		int n = atoi(argv[2]);
		uint64_t work_us = (uint64_t)atoll(argv[3]), sleep_us = (uint64_t)atoll(argv[4]);
		if (n <= 0) return 2;
		uint64_t *lat = calloc((size_t)n, sizeof *lat);
		for (int i = 0; i < n; i++) {
			uint64_t t0 = now_ns();
			work(work_us);
			lat[i] = (now_ns() - t0) / 1000;
			usleep((useconds_t)sleep_us);
		}
		qsort(lat, (size_t)n, sizeof *lat, cmp);
		printf("n=%d p50_us=%llu p90_us=%llu p99_us=%llu max_us=%llu\n", n,
		       (unsigned long long)lat[n * 50 / 100], (unsigned long long)lat[n * 90 / 100],
		       (unsigned long long)lat[n * 99 / 100], (unsigned long long)lat[n - 1]);
		return 0;
	}
	fprintf(stderr, "usage: effbench touch MB | duty PCT MB | spin | probe N WORK_US SLEEP_US\n");
	return 2;
}
