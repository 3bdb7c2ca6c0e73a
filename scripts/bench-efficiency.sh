#!/usr/bin/env bash
# bench-efficiency.sh [reclaim|qos|overcommit|all]: the memory and CPU
# efficiency benchmarks of issue 6, each against its own real `dsec serve`
# (root; a fresh data dir under $WORK, removed at exit). Prints the figures
# and the exact commands behind them.
#
#   reclaim     N idle sandboxes that each touched 32 MiB of anonymous memory
#               and read 64 MiB of image files, served with --swap zram and
#               --reclaim-idle-after; MemAvailable regained 60 s after they
#               went idle, sandboxes killed, first exec before/after.
#   qos         p99 latency of a sandbox serving small CPU requests, on an
#               idle node and while sandboxes saturate every core, with the
#               classes (latency vs batch) and without them (all standard).
#   overcommit  sandboxes requesting 1 CPU and using 5% of one, each holding
#               HOLD_MB: how many the node admits, and the refusal at the end.
#
# Environment: N (reclaim sandboxes, 500), P (parallel creates, 8),
# IDLE (reclaim idle time, 30s), HOLD_MB (overcommit, 384), RESERVE
# (overcommit --memory-reserve, 12Gi: the node stops early enough to leave a
# shared machine its memory), OVERCOMMIT (2: measured use cannot exceed the cores, so a
# larger ratio never refuses for CPU on a saturated node), DSEC (a built binary; built
# from this tree when unset), WORK (scratch dir).
set -euo pipefail

what=${1:-all}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
N=${N:-500}
P=${P:-8}
IDLE=${IDLE:-30s}
HOLD_MB=${HOLD_MB:-384}
RESERVE=${RESERVE:-12Gi}
OVERCOMMIT=${OVERCOMMIT:-2}
WORK=${WORK:-$(mktemp -d /tmp/dsec-effbench.XXXXXX)}
mkdir -p "$WORK"

[ "$(id -u)" = 0 ] || { echo "bench-efficiency: needs root (dsec serve)" >&2; exit 1; }
if [ -z "${DSEC:-}" ]; then
  DSEC=$WORK/dsec
  (cd "$repo" && go build -o "$DSEC" ./cmd/dsec)
fi

server_pid=""
data=""
log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
d() { "$DSEC" "$@"; }
memavail() { awk '/^MemAvailable:/ {printf "%.0f\n", $2 * 1024}' /proc/meminfo; }
ms_now() { date +%s%3N; }

start_server() { # NAME ARGS...
  local name=$1; shift
  data=$WORK/$name
  mkdir -p "$data"
  export DSEC_ADDR=unix://$data/dsec.sock
  echo "+ dsec serve --data-dir $data --listen $DSEC_ADDR $*" >&2
  "$DSEC" serve --data-dir "$data" --listen "$DSEC_ADDR" "$@" >"$data/serve.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 200); do
    d node ls >/dev/null 2>&1 && return 0
    kill -0 "$server_pid" 2>/dev/null || { tail -5 "$data/serve.log" >&2; return 1; }
    sleep 0.1
  done
  echo "server did not come up" >&2
  return 1
}

stop_server() {
  [ -n "$server_pid" ] || return 0
  d sandbox ls -q 2>/dev/null | xargs -r -P "$P" -n 1 "$DSEC" sandbox rm >/dev/null 2>&1 || true
  kill -TERM "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  "$DSEC" layerd-stop --data-dir "$data" >/dev/null 2>&1 || true
  server_pid=""
}
trap 'stop_server; rm -rf "$WORK"' EXIT

# The image: the busybox test rootfs, the workload binary, 64 MiB of files.
image() {
  [ -e "$WORK/rootfs/bin/effbench" ] && { d image import eff:1 "$WORK/rootfs" >/dev/null; return; }
  "$repo/scripts/mkrootfs.sh" "$WORK/rootfs" >/dev/null
  gcc -O2 -static -o "$WORK/rootfs/bin/effbench" "$here/bench-efficiency.c"
  mkdir -p "$WORK/rootfs/data"
  for i in 1 2 3 4; do head -c 16M /dev/urandom >"$WORK/rootfs/data/f$i"; done
  d image import eff:1 "$WORK/rootfs" >/dev/null
}

# exec_ms ID: wall time of one `dsec exec ID -- true`, CLI start included.
exec_ms() {
  local t0 t1
  t0=$(ms_now)
  d exec "$1" -- true
  t1=$(ms_now)
  echo $((t1 - t0))
}

# charge IDS: "HELD SWAPPED" bytes summed over the sandboxes' memory cgroups.
charge() {
  local id files=()
  for id in $1; do files+=("/sys/fs/cgroup/memory/dsec/sandboxes/$id/memory.stat"); done
  awk '$1 == "rss" || $1 == "cache" {h += $2} $1 == "swap" {s += $2} END {printf "%.0f %.0f\n", h, s}' "${files[@]}"
}

stats_of() { sort -n | awk '{a[NR]=$1; s+=$1} END {if (NR) printf "p50 %d ms, mean %.1f ms, max %d ms (n=%d)", a[int((NR+1)/2)], s/NR, a[NR], NR}'; }

bench_reclaim() {
  local zram=$((N * 40))M
  start_server reclaim --swap "zram:$zram" --reclaim-idle-after "$IDLE" --default-pids 32
  image
  local a0 a1 t_idle
  a0=$(memavail)
  log "reclaim: creating $N sandboxes ($P at a time), each reads /data (64 MiB) and touches 32 MiB"
  # Create first, then touch in a second, quick pass: every sandbox's last
  # activity falls within a few seconds, well inside the idle time.
  echo "+ dsec sandbox create --image eff:1 --memory 128Mi --cpu 0.05 --label bench=reclaim  (x$N)" >&2
  seq "$N" | xargs -P "$P" -I{} "$DSEC" sandbox create --image eff:1 --memory 128Mi --cpu 0.05 --label bench=reclaim >/dev/null
  local ids
  ids=$(d sandbox ls -q --label bench=reclaim)
  echo "+ dsec exec ID -- sh -c 'cat /data/* >/dev/null; (effbench touch 32 >/dev/null 2>&1 &)'  (each sandbox)" >&2
  local t_touch=$(date +%s)
  echo "$ids" | xargs -P "$P" -I{} "$DSEC" exec {} -- sh -c 'cat /data/* >/dev/null; (effbench touch 32 >/dev/null 2>&1 &)' >/dev/null
  local touch_s=$(( $(date +%s) - t_touch ))
  log "reclaim: touched in ${touch_s}s"
  sleep 2 # the last touches finish
  local n
  n=$(echo "$ids" | wc -l)
  local sample
  sample=$(echo "$ids" | head -20)
  local before after
  before=$(for id in $sample; do exec_ms "$id"; done | stats_of)
  t_idle=$(date +%s)
  a1=$(memavail)
  # What they hold, from their cgroups (v1 memory.stat): charge now plus
  # what is already out in swap (pushed out while the slower setup of the
  # last sandboxes ran), which they held before.
  read -r h0 s0 < <(charge "$ids")
  local base=$((h0 + s0))
  log "reclaim: $n sandboxes hold $((base >> 20)) MiB (charged $((h0 >> 20)), already swapped $((s0 >> 20))); MemAvailable fell $(((a0 - a1) >> 20)) MiB; idle from now"
  local t back60="" acct60="" zdev
  zdev=$(grep -o '"device":"/dev/zram[0-9]*"' "$data/serve.log" | head -1 | cut -d'"' -f4)
  for t in $(seq 5 5 90); do
    sleep $((t_idle + t - $(date +%s))) 2>/dev/null || true
    local a h s z pct
    a=$(memavail)
    read -r h s < <(charge "$ids")
    z=$(awk '{printf "%.0f", $3}' "/sys/block/${zdev#/dev/}/mm_stat")
    # Freed: what left their charge, minus the memory zram keeps of it.
    pct=$(( (base - h - z) * 100 / base ))
    log "reclaim: t=${t}s: charged $((h >> 20)) MiB, swapped $((s >> 20)) MiB in $((z >> 20)) MiB of zram: ${pct}% of held is free; MemAvailable +$(((a - a1) >> 20)) MiB"
    if [ "$t" = 60 ]; then acct60=$pct; back60=$(((a - a1) >> 20)); fi
  done
  local running killed alive
  running=$(d sandbox ls --json --label bench=reclaim | jq '[.[] | select(.state == "running")] | length')
  killed=0
  for id in $ids; do
    k=$(awk '/^oom_kill / {print $2}' "/sys/fs/cgroup/memory/dsec/sandboxes/$id/memory.oom_control" 2>/dev/null || echo 0)
    killed=$((killed + k))
  done
  alive=$(pgrep -c -x effbench || true)
  after=$(for id in $sample; do exec_ms "$id"; done | stats_of)
  cat <<EOF
## reclaim ($n sandboxes, --swap zram:$zram, --reclaim-idle-after $IDLE)
touch pass took ${touch_s}s (the first sandboxes idled that much before the clock below starts)
held at the end of setup: $((base >> 20)) MiB (charge $((h0 >> 20)) MiB + already in swap $((s0 >> 20)) MiB)
freed 60 s after the last sandbox idled: ${acct60}% of held (charge released minus zram's memory)
MemAvailable 60 s after: +${back60} MiB over the end of setup (moves with other work on this shared machine)
sandboxes running: $running of $n; OOM kills: $killed; workload processes alive: $alive of $n
first exec (dsec exec ID -- true, CLI included), 20 sandboxes:
  before idling: $before
  after reclaim: $after
zram $zdev: $(awk '{if ($3) printf "%d MiB stored in %d MiB of memory (%.1f:1)", $1/1048576, $3/1048576, $1/$3}' "/sys/block/${zdev#/dev/}/mm_stat")
EOF
  stop_server
}

# probe ID: p99 (and the rest) of 3000 requests of 500 us of CPU, 5 ms apart.
probe() { d exec "$1" -- effbench probe 3000 500 5000; }

spinners() { # CLASS COUNT: sandboxes each spinning 2 cores
  local i id
  for i in $(seq "$2"); do
    id=$(d sandbox create --image eff:1 --qos "$1" --cpu 1 --label bench=spin)
    d exec "$id" -- sh -c '(effbench spin >/dev/null 2>&1 &); (effbench spin >/dev/null 2>&1 &)' >/dev/null
  done
}

bench_qos() {
  start_server qos
  image
  local lat std idle with without
  lat=$(d sandbox create --image eff:1 --qos latency --cpu 1)
  std=$(d sandbox create --image eff:1 --qos standard --cpu 1)
  echo "+ dsec exec ID -- effbench probe 3000 500 5000   (in a latency / a standard sandbox)" >&2
  idle=$(probe "$lat")
  log "qos: idle node, latency sandbox: $idle"
  echo "+ 2 sandboxes --qos batch, each: effbench spin x2" >&2
  spinners batch 2
  sleep 2
  with=$(probe "$lat")
  log "qos: with classes (latency vs batch): $with"
  d sandbox ls -q --label bench=spin | xargs -r -n 1 "$DSEC" sandbox rm >/dev/null
  echo "+ 2 sandboxes --qos standard, each: effbench spin x2" >&2
  spinners standard 2
  sleep 2
  without=$(probe "$std")
  log "qos: without classes (standard vs standard): $without"
  local p_idle p_with p_without
  p_idle=$(echo "$idle" | sed -n 's/.*p99_us=\([0-9]*\).*/\1/p')
  p_with=$(echo "$with" | sed -n 's/.*p99_us=\([0-9]*\).*/\1/p')
  p_without=$(echo "$without" | sed -n 's/.*p99_us=\([0-9]*\).*/\1/p')
  cat <<EOF
## qos (3000 requests of 500 us CPU, 5 ms apart; 4 spinning processes on $(nproc) cores)
idle node:                       $idle
loaded, latency vs batch:        $with
loaded, all standard:            $without
p99 inflation vs idle: with classes $(awk -v a="$p_with" -v b="$p_idle" 'BEGIN {printf "%+.0f%%", (a/b-1)*100}'), without $(awk -v a="$p_without" -v b="$p_idle" 'BEGIN {printf "%+.0f%%", (a/b-1)*100}')
EOF
  stop_server
}

bench_overcommit() {
  start_server overcommit --cpu-overcommit "$OVERCOMMIT" --memory-reserve "$RESERVE"
  image
  local cores admitted=0 waits=0 out reason=""
  cores=$(nproc)
  echo "+ dsec sandbox create --image eff:1 --cpu 1 --memory 512Mi --label bench=oc; dsec exec ID -- sh -c '(effbench duty 5 $HOLD_MB &); sleep 1'  (until refused for memory)" >&2
  while [ "$admitted" -lt 300 ]; do # a bound, should nothing refuse
    if out=$(d sandbox create --image eff:1 --cpu 1 --memory 512Mi --label bench=oc 2>&1); then
      d exec "$out" -- sh -c "(effbench duty 5 $HOLD_MB >/dev/null 2>&1 &); sleep 1" >/dev/null
      admitted=$((admitted + 1))
      waits=0
      continue
    fi
    reason=$out
    case "$out" in
      *memory*) break ;;
      *cpu*)
        # Newcomers count with their request until measured (~10 s).
        waits=$((waits + 1))
        [ "$waits" -le 20 ] || break
        sleep 2 ;;
      *) break ;;
    esac
  done
  local cap cpu_used
  cap=$(d node capacity --cpu 1 --memory 512Mi --json | jq -c .)
  cpu_used=$(d node ls --json | jq '[.[].cpu_used] | add')
  cat <<EOF
## overcommit (--cpu-overcommit $OVERCOMMIT --memory-reserve $RESERVE; sandboxes of --cpu 1 --memory 512Mi using 5% CPU, holding $HOLD_MB MiB)
admitted: $admitted sandboxes on $cores cores ($(awk -v a="$admitted" -v c="$cores" 'BEGIN {printf "%.1f", a/c}')x cores; by requests $((cores * ${OVERCOMMIT%.*})) would fit)
measured CPU now: $cpu_used cores
refusal: $reason
capacity now: $cap
EOF
  stop_server
}

case $what in
  reclaim) bench_reclaim ;;
  qos) bench_qos ;;
  overcommit) bench_overcommit ;;
  all) bench_qos; bench_overcommit; bench_reclaim ;;
  *) echo "usage: bench-efficiency.sh [reclaim|qos|overcommit|all]" >&2; exit 2 ;;
esac
