#!/usr/bin/env bash
# bench-ab.sh: one measurement against a fresh `dsec serve` of the binary
# BIN, for comparing builds (run two binaries alternately, several rounds).
# Root. Sandbox state lives under /var/tmp; the image is a busybox rootfs.
#
#   scripts/bench-ab.sh exec BIN [N]     dsec bench exec --n N --parallel 1, and
#                                        the server's CPU per exec
#   scripts/bench-ab.sh create BIN [N]   dsec bench create --n N --parallel 2
#   scripts/bench-ab.sh held BIN N       hold N idle sandboxes (bench density
#                                        --keep), then bench create --n 200
#                                        twice, then delete the N
#   scripts/bench-ab.sh slab BIN N       free empty slab pages, hold N, and
#                                        print MemAvailable drop and kmalloc
#                                        objects per sandbox
# SERVE_ARGS adds flags to dsec serve; PERF=FILE records `perf record -a -g`
# during held's first bench create.
set -euo pipefail
cmd=${1:?usage: bench-ab.sh exec|create|held|slab BIN [N]}
BIN=$(realpath "${2:?binary}")
N=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/benchlib.sh
. "$root/scripts/benchlib.sh"
rootfs=/var/tmp/dsec-bench-rootfs
[ -d "$rootfs" ] || "$root/scripts/mkrootfs.sh" "$rootfs" >/dev/null
w=$(mktemp -d /var/tmp/dsec-ab.XXXXXX)
export DSEC_ADDR="unix://$w/s.sock"
server=
cleanup() {
  set +e
  if [ -n "$server" ]; then
    rm_all_sandboxes "$BIN" 2
    kill "$server"; wait "$server"
    "$BIN" layerd-stop --data-dir "$w/d" --force >/dev/null 2>&1
  fi
  rm -rf "$w"
}
trap cleanup EXIT
# shellcheck disable=SC2086
"$BIN" serve --data-dir "$w/d" --listen "$DSEC_ADDR" --log-level warn ${SERVE_ARGS:-} >"$w/log" 2>&1 &
server=$!
for _ in $(seq 100); do [ -S "$w/s.sock" ] && break; sleep 0.1; done
"$BIN" image import bench:1 "$rootfs" >/dev/null
case $cmd in
exec)
  # Also the server's CPU per exec (utime+stime ticks of dsec serve).
  cpu() { awk '{print $14+$15}' "/proc/$server/stat"; }
  t0=$(cpu)
  "$BIN" bench exec --n "${N:-600}" --parallel 1 --image bench:1 --json
  t1=$(cpu)
  awk -v t="$((t1 - t0))" -v n="${N:-600}" -v hz="$(getconf CLK_TCK)" \
    'BEGIN { printf "server CPU per exec: %.3f ms\n", t * 1000 / hz / n }'
  ;;
create) "$BIN" bench create --n "${N:-300}" --parallel 2 --image bench:1 --json ;;
held)
  "$BIN" bench density --n "$N" --parallel 2 --image bench:1 --settle 0s --keep --json
  if [ -n "${PERF:-}" ]; then
    perf record -a -g -o "$PERF" -- "$BIN" bench create --n 200 --parallel 2 --image bench:1 --json
  else
    "$BIN" bench create --n 200 --parallel 2 --image bench:1 --json
  fi
  "$BIN" bench create --n 200 --parallel 2 --image bench:1 --json
  t0=$(date +%s.%N)
  rm_all_sandboxes "$BIN" 2
  t1=$(date +%s.%N)
  python3 -c "print('teardown of $N held: %.1f/s' % ($N / ($t1 - $t0)))"
  ;;
slab)
  shrink_slabs
  slabs() { grep -E '^kmalloc-(cg-)?(512|1k) ' /proc/slabinfo | awk '{print $1, $2}'; }
  slabs >"$w/before"
  "$BIN" bench density --n "$N" --parallel 2 --image bench:1 --settle 5s --keep --json | grep -E 'host_bytes|"n"'
  slabs >"$w/after"
  paste "$w/before" "$w/after" | awk -v n="$N" '{printf "%s objects per sandbox: %.1f\n", $1, ($4 - $2) / n}'
  ;;
*) echo "unknown command $cmd" >&2; exit 2 ;;
esac
