#!/usr/bin/env bash
# bench.sh: dsec's benchmarks beside this machine's physical limits, in one
# run (root). The raw C reference is ../shared/limits/sbx.c (a sandbox with
# the same namespaces, overlay, cgroups and a static init, and nothing else).
# Output: a markdown block to paste into docs/perf.md with the figures.
#   BENCH_N=300 BENCH_DENSITY_N=1000 scripts/bench.sh
# BENCH_SHRINK_SLABS=0 keeps the slab caches as they are before the density
# runs (default: empty slab pages are freed first, see shrink_slabs).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/benchlib.sh
. scripts/benchlib.sh
N=${BENCH_N:-300}
DN=${BENCH_DENSITY_N:-1000}
LIMITS=${DSEC_LIMITS_DIR:-$PWD/../shared/limits}
make -s build
BIN=$PWD/bin/dsec
# /var/tmp, not /tmp: a /tmp crowded by other programs makes directory
# operations (every create writes a few files) measurably slower.
work=$(mktemp -d /var/tmp/dsec-bench.XXXXXX)
server=
cleanup() {
  set +e
  if [ -n "$server" ]; then
    rm_all_sandboxes "$BIN"
    kill "$server"; wait "$server"
    "$BIN" layerd-stop --data-dir "$work/data" --force
  fi
  # The reference leaves its (empty) parent cgroups behind.
  rmdir /sys/fs/cgroup/memory/probe_sbx/mgr /sys/fs/cgroup/*/probe_sbx 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
scripts/mkrootfs.sh "$work/rootfs" >/dev/null

echo "### $(date -u +%Y-%m-%d) on $(nproc) cores, kernel $(uname -r)"
echo
if [ -f "$LIMITS/sbx.c" ]; then
  gcc -Os -static -o "$work/pause" "$LIMITS/pause.c"
  gcc -O2 -o "$work/sbx" "$LIMITS/sbx.c" -lpthread
  mkdir -p "$work/refroot/sbin" "$work/refrun"
  cp -a "$work/rootfs/." "$work/refroot/"
  cp "$work/pause" "$work/refroot/sbin/pause"
  echo "Raw C reference: \`sbx -n $N -p 2 -F\` (same run):"
  echo '```'
  # sbx writes run.pids and slab.* into its working directory.
  (cd "$work" && ./sbx -n "$N" -p 2 -r "$work/refroot" -d "$work/refrun" -F 2>&1 | tail -n 25)
  echo '```'
else
  echo "(no $LIMITS/sbx.c: raw reference skipped)"
fi

export DSEC_ADDR="unix://$work/dsec.sock"
# BENCH_SERVE_ARGS: extra flags, e.g. "--default-disk 0" (no per-sandbox file system).
# shellcheck disable=SC2086
"$BIN" serve --data-dir "$work/data" --listen "$DSEC_ADDR" --log-level warn ${BENCH_SERVE_ARGS:-} >"$work/serve.log" 2>&1 &
server=$!
for _ in $(seq 100); do [ -S "$work/dsec.sock" ] && break; sleep 0.1; done
"$BIN" image import bench:1 "$work/rootfs" >/dev/null
echo "dsec serve flags: ${BENCH_SERVE_ARGS:-(defaults: --default-disk 1Gi)}"
echo
run() { echo "\`dsec $*\`:"; echo '```'; "$BIN" "$@"; echo '```'; }
run bench create --n "$N" --parallel 2 --image bench:1 --json
run bench exec --n "$((N * 2))" --parallel 1 --image bench:1 --json
run bench exec --n "$((N * 2))" --parallel 2 --image bench:1 --json
if [ "${BENCH_SHRINK_SLABS:-1}" = 1 ]; then shrink_slabs; fi
run bench density --n "$DN" --parallel 2 --image bench:1 --json
if [ -x "$work/sbx" ]; then
  if [ "${BENCH_SHRINK_SLABS:-1}" = 1 ]; then shrink_slabs; fi
  # After dsec's runs: thousands of destroyed memory cgroups slow every
  # later create on this kernel, so the reference density must come last.
  echo "Raw C reference density: \`sbx -n $DN -p 2 -F -H 5\` (same run):"
  echo '```'
  (cd "$work" && ./sbx -n "$DN" -p 2 -r "$work/refroot" -d "$work/refrun" -F -H 5 -q 2>&1 | grep -E "MemAvailable drop|init process|=>")
  echo '```'
fi
