#!/usr/bin/env bash
# bench-images.sh: issue 3's image figures with a real server and a real
# image (debootstrap minbase of Debian bookworm + python3: ~155 MiB of
# files, a 175 MB tar), run as root. The rootfs tarball is built once from
# Debian's packages and cached.
#   scripts/bench-images.sh            # build if needed, then measure
#   scripts/bench-images.sh build      # only build the cached tarball
# Env: BENCH_SANDBOXES (100), BENCH_CREATE_N (40), BENCH_COLD_N (10),
#      BENCH_DROP_CACHES (1), BENCH_PARTS (abcd), DEBIAN_MIRROR,
#      DSEC_BENCH_CACHE (/var/cache/dsec-bench), DSEC (a built binary to
#      measure instead of building the tree: for A/B runs).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${DSEC_BENCH_CACHE:-/var/cache/dsec-bench}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TARBALL=$CACHE/bookworm-minbase-python3.tar

build_image() {
  [ -s "$TARBALL" ] && return 0
  mkdir -p "$CACHE"
  command -v debootstrap >/dev/null || apt-get install -y debootstrap >&2
  local b
  b=$(mktemp -d "$CACHE/build.XXXXXX")
  echo "building $TARBALL with debootstrap (minbase bookworm + python3) ..." >&2
  debootstrap --variant=minbase --include=python3 bookworm "$b/root" "$MIRROR" >&2
  # Downloaded .debs and apt lists are not part of the image.
  rm -rf "$b/root/var/cache/apt/archives/"*.deb "$b/root/var/lib/apt/lists/"*
  tar -C "$b/root" --numeric-owner --xattrs -cf "$TARBALL.tmp" .
  mv "$TARBALL.tmp" "$TARBALL"
  rm -rf "$b"
}

build_image
[ "${1:-}" = build ] && exit 0

# Measurements. Output: a markdown block (figures + the commands that
# produced them) for docs/perf.md on stdout; progress on stderr.
NSB=${BENCH_SANDBOXES:-100}
NCREATE=${BENCH_CREATE_N:-40}
NCOLD=${BENCH_COLD_N:-10}
DROP=${BENCH_DROP_CACHES:-1} # cold-page-cache variants (drop_caches)
PARTS=${BENCH_PARTS:-abcd}   # which measurements to run
IMG=bookworm-py:1
work=$(mktemp -d /var/tmp/dsec-bench-images.XXXXXX)
D=$work/data
BLOBS=$work/blobs
export DSEC_ADDR="unix://$work/dsec.sock"
BIN=${DSEC:-$work/dsec}
[ -n "${DSEC:-}" ] || go build -o "$BIN" ./cmd/dsec
server=
log() { echo "bench-images: $*" >&2; }
dsec() { "$BIN" "$@"; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
ms() { python3 -c "import json,sys; d=json.load(sys.stdin); print(f'{d[\"$1\"]:.1f}')"; }
cached_kb() { awk '/^Cached:/ {print $2}' /proc/meminfo; }
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

start_server() {
  "$BIN" serve --data-dir "$D" --listen "$DSEC_ADDR" --store "dir:$BLOBS" --log-level warn >>"$work/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 200); do dsec image ls >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "server did not start:" >&2; tail "$work/serve.log" >&2; exit 1
}
rm_all() {
  dsec sandbox ls --json 2>/dev/null | json '"\n".join(s["id"] for s in d)' | xargs -r -n 50 "$BIN" sandbox rm >/dev/null 2>&1 || true
}
stop_server() {
  [ -n "$server" ] || return 0
  rm_all
  kill "$server"; wait "$server" || true
  server=
  dsec layerd-stop --data-dir "$D" --force
}
# empty_cache restarts the node with an empty chunk cache: the layer
# daemon (FUSE mounts, cache) is stopped and its cache deleted.
empty_cache() { stop_server; rm -rf "$D/chunk-cache"; start_server; }
cleanup() {
  set +e
  stop_server
  rm -rf "$work"
}
trap cleanup EXIT
# in_sb ID SCRIPT: run SCRIPT in the sandbox, print its duration in us
# (timed inside the sandbox: no API or exec overhead).
in_sb() {
  dsec exec "$1" -- sh -c 's=$(date +%s%N); '"$2"' >/dev/null 2>&1; e=$(date +%s%N); echo $(((e - s) / 1000))'
}
on_host() {
  local s e
  s=$(date +%s%N); sh -c "$1" >/dev/null 2>&1; e=$(date +%s%N); echo $(((e - s) / 1000))
}
# best_pair N DROP ID SANDBOX_CMD HOST_CMD: "sandbox host" best times of N
# rounds, each timing the sandbox then the host (alternated, so both see
# the same load on a shared machine); DROP=1 drops the caches before each.
best_pair() {
  local sb= h= v
  for _ in $(seq "$1"); do
    [ "$2" = 1 ] && drop_caches
    v=$(in_sb "$3" "$4"); { [ -z "$sb" ] || [ "$v" -lt "$sb" ]; } && sb=$v
    [ "$2" = 1 ] && drop_caches
    v=$(on_host "$5"); { [ -z "$h" ] || [ "$v" -lt "$h" ]; } && h=$v
  done
  echo "$sb $h"
}
ratio() { python3 -c "print(f'{$1/$2:.2f}')"; }

start_server
log "importing $TARBALL"
dsec image import "$IMG" "$TARBALL" >/dev/null
IMAGE_BYTES=$(dsec image inspect "$IMG" --json | json 'd["size"]')

echo "### Images: $(date -u +%Y-%m-%d) on $(nproc) cores, kernel $(uname -r)"
echo
echo "Image: debootstrap --variant=minbase --include=python3 bookworm ($(ratio "$IMAGE_BYTES" 1048576) MiB of files," \
  "$(tar -tf "$TARBALL" | wc -l) entries), imported from a rootfs tar into a dir blob store; lazy layers (FUSE, passthrough)."
echo "Script: \`scripts/bench-images.sh\` (BENCH_SANDBOXES=$NSB BENCH_CREATE_N=$NCREATE BENCH_COLD_N=$NCOLD BENCH_DROP_CACHES=$DROP)."
echo

if [[ $PARTS == *a* ]]; then
# (a) First python3 in a fresh sandbox, empty node cache.
log "(a) lazy fetch of a first python3 -c 'import json'"
empty_cache
id=$(dsec sandbox create --image "$IMG" --memory 256Mi)
dsec exec "$id" -- python3 -c 'import json'
st=$(dsec image stats "$IMG" --json)
F=$(echo "$st" | json 'd["fetched_bytes"]')
T=$(echo "$st" | json 'd["transferred_bytes"]')
R=$(echo "$st" | json 'd["read_bytes"]')
echo "**(a) First \`python3 -c 'import json'\` in a fresh sandbox, empty node cache** (\`dsec image stats $IMG --json\`):"
echo
echo "| image bytes | fetched (uncompressed) | transferred from the store | read | fetched / image | transferred / read | fetched / read |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
echo "| $IMAGE_BYTES | $F | $T | $R | $(python3 -c "print(f'{100*$F/$IMAGE_BYTES:.1f}%')") | $(ratio "$T" "$R") | $(ratio "$F" "$R") |"
echo
echo "Targets: fetched <= 15% of the image, <= 1.3x read."
echo

fi

if [[ $PARTS == *b* ]]; then
# (b) Page cache growth: NSB sandboxes of the image reading the same files.
# Host-wide Cached moves with everything else on the machine, so the page
# cache attributable to the image is counted where it can live: pages of
# the node's chunk cache and of the blob store's files (fincore), plus
# what each sandbox's memory cgroup is charged for page cache (pages the
# sandbox touched first: non-passthrough layer files, its upper dir, its
# tmpfs). Each page is charged once, to whoever touched it first.
sb_cache_kb() { # sum of page cache charged to the given sandboxes' cgroups
  local t=0 f v
  for id in "$@"; do
    for f in /sys/fs/cgroup/memory/dsec*/sandboxes/"$id"/memory.stat /sys/fs/cgroup/dsec*/sandboxes/"$id"/memory.stat; do
      [ -f "$f" ] || continue
      v=$(awk '$1 == "total_cache" || $1 == "file" {print int($2 / 1024); exit}' "$f")
      t=$((t + ${v:-0}))
    done
  done
  echo "$t"
}
files_cache_kb() { # resident page cache of every file below the dirs
  find "$@" -type f -print0 2>/dev/null | xargs -0 -r fincore -b -n -o RES 2>/dev/null | awk '{s += $1} END {print int(s / 1024)}'
}
image_cache_kb() { echo $(($(files_cache_kb "$D/chunk-cache" "$BLOBS") + $(sb_cache_kb "${ids[@]}"))); }
log "(b) page cache growth of $NSB sandboxes"
empty_cache
[ "$DROP" = 1 ] && drop_caches
ids=()
for _ in $(seq "$NSB"); do ids+=("$(dsec sandbox create --image "$IMG" --memory 128Mi --cpu 0.05)"); done
for id in "${ids[@]}"; do dsec exec "$id" -- true; done # first-exec effects
h0=$(cached_kb); c0=$(image_cache_kb)
dsec exec "${ids[0]}" -- python3 -c 'import json'
h1=$(cached_kb); c1=$(image_cache_kb)
for id in "${ids[@]:1}"; do dsec exec "$id" -- python3 -c 'import json'; done
hn=$(cached_kb); cn=$(image_cache_kb)
# Control: the same execs running `true`: what exec itself adds.
for id in "${ids[@]:1}"; do dsec exec "$id" -- true; done
ct=$(image_cache_kb)
d1=$((c1 - c0)); dn=$((cn - c0)); dt=$((ct - cn))
echo "**(b) Page cache as $NSB sandboxes each run \`python3 -c 'import json'\`** (empty node cache$([ "$DROP" = 1 ] && echo ", page cache dropped first"), sandboxes already created). Counted: resident pages of the chunk cache and blob store files (\`fincore\`) + page cache charged to the sandboxes' memory cgroups:"
echo
echo "| after sandbox 1 | after all $NSB | growth, $NSB vs 1 | control: $((NSB - 1)) more execs of \`true\` | host-wide Cached (noisy): after 1 / after $NSB |"
echo "| --- | --- | --- | --- | --- |"
echo "| +$d1 KiB | +$dn KiB | $(ratio "$dn" "$d1")x | +$dt KiB | +$((h1 - h0)) / +$((hn - h0)) KiB |"
echo
echo "Target: <= 1.2x."
echo
rm_all

fi

if [[ $PARTS == *c* ]]; then
# (c) Create latency with an empty node cache (each sample: a node whose
# layer daemon and chunk cache are new) and with a warm one.
log "(c) create latency, $NCOLD cold samples"
cold=()
for _ in $(seq "$NCOLD"); do
  empty_cache
  cold+=("$(dsec bench create --n 1 --parallel 1 --image "$IMG" --json | json 'd["p50_ms"]')")
done
coldstats=$(printf '%s\n' "${cold[@]}" | python3 -c 'import sys,statistics as s; v=sorted(float(x) for x in sys.stdin); print(f"{s.median(v):.1f} | {v[-1]:.1f}")')
dropstats="-"
if [ "$DROP" = 1 ]; then
  drop=()
  for _ in 1 2 3; do
    empty_cache; drop_caches
    drop+=("$(dsec bench create --n 1 --parallel 1 --image "$IMG" --json | json 'd["p50_ms"]')")
  done
  dropstats=$(printf '%s\n' "${drop[@]}" | python3 -c 'import sys,statistics as s; v=sorted(float(x) for x in sys.stdin); print(f"{s.median(v):.1f} (max {v[-1]:.1f}, 3 samples)")')
fi
w1=$(dsec bench create --n "$NCREATE" --parallel 1 --image "$IMG" --json)
w2=$(dsec bench create --n "$NCREATE" --parallel 2 --image "$IMG" --json)
echo "**(c) Create latency** (\`dsec bench create --n 1 --parallel 1 --image $IMG\` on a node restarted with an empty chunk cache, $NCOLD times; then \`dsec bench create --n $NCREATE --parallel 1|2\` warm):"
echo
echo "| empty node cache p50 | max | + page cache dropped p50 | warm p50 / p99, parallel 1 | warm p50 / p99 (creates/s), parallel 2 |"
echo "| --- | --- | --- | --- | --- |"
echo "| $coldstats ms | $dropstats ms | $(echo "$w1" | ms p50_ms) / $(echo "$w1" | ms p99_ms) ms | $(echo "$w2" | ms p50_ms) / $(echo "$w2" | ms p99_ms) ms ($(echo "$w2" | ms per_sec)/s) |"
echo
echo "Target: empty-cache p50 <= 300 ms."
echo

fi

if [[ $PARTS == *d* ]]; then
# (d) Large-file throughput and small-file metadata through the sandbox
# root vs the same on the host's disk. lazyfs decides a file's I/O mode at
# its first open in a mount: passthrough if all its chunks are cached then,
# through the daemon otherwise. Both are measured: the first mount reads
# the file while fetching it (daemon mode); after a node restart that kept
# the chunk cache, a new mount opens it fully cached (passthrough).
log "(d) throughput and metadata"
id=$(dsec sandbox create --image "$IMG" --memory 512Mi)
dsec exec "$id" -- sh -c 'head -c 268435456 /dev/urandom > /big.bin'
dsec sandbox snapshot "$id" bookworm-py:big >/dev/null
dsec sandbox rm "$id" >/dev/null
head -c 268435456 /dev/urandom >"$work/direct.bin"
mkdir "$work/rootfs"
tar -C "$work/rootfs" --numeric-owner -xf "$TARBALL"
rd="dd if=/big.bin of=/dev/null bs=1M"
hrd="dd if=$work/direct.bin of=/dev/null bs=1M"
ls_sb="ls -lR /usr"
ls_host="ls -lR $work/rootfs/usr"
st_sb="find /usr -size +0"
st_host="find $work/rootfs/usr -size +0"
mibs() { python3 -c "print(f'{256/($1/1e6):.0f} MiB/s')"; }
# read_rows LABEL ID: reads of /big.bin in sandbox ID vs the host file,
# alternated (the machine may be shared: best of 5 rounds when warm, of 3
# when the page cache is dropped before each read).
read_rows() {
  local w= hw= c= hc= v
  for _ in 1 2 3 4 5; do
    v=$(in_sb "$2" "$rd"); { [ -z "$w" ] || [ "$v" -lt "$w" ]; } && w=$v
    v=$(on_host "$hrd"); { [ -z "$hw" ] || [ "$v" -lt "$hw" ]; } && hw=$v
  done
  echo "| $1, page cache warm | $(mibs "$w") | $(mibs "$hw") | $(ratio "$hw" "$w") |"
  if [ "$DROP" = 1 ]; then
    for _ in 1 2 3; do
      drop_caches; v=$(in_sb "$2" "$rd"); { [ -z "$c" ] || [ "$v" -lt "$c" ]; } && c=$v
      drop_caches; v=$(on_host "$hrd"); { [ -z "$hc" ] || [ "$v" -lt "$hc" ]; } && hc=$v
    done
    echo "| $1, page cache dropped | $(mibs "$c") | $(mibs "$hc") | $(ratio "$hc" "$c") |"
  fi
}
id=$(dsec sandbox create --image bookworm-py:big --memory 512Mi)
dsec exec "$id" -- sh -c 'cat /big.bin > /dev/null' # fetched into the node cache
rows=$(read_rows "first mount (through the daemon)" "$id")
stop_server; start_server # keeps the chunk cache
id=$(dsec sandbox create --image bookworm-py:big --memory 512Mi)
rows="$rows
$(read_rows "new mount, file cached (passthrough)" "$id")"
echo "**(d) Reading a 256 MiB file (in the node cache) through the sandbox root vs a file on the same disk** (\`$rd\` timed inside the sandbox vs the same \`dd\` of a host file):"
echo
echo "| | sandbox | host | sandbox / host |"
echo "| --- | --- | --- | --- |"
echo "$rows"
echo
in_sb "$id" "$ls_sb" >/dev/null; on_host "$ls_host" >/dev/null # warm both
read -r stw_sb stw_host < <(best_pair 5 0 "$id" "$st_sb" "$st_host")
read -r lsw_sb lsw_host < <(best_pair 5 0 "$id" "$ls_sb" "$ls_host")
cold_row=
if [ "$DROP" = 1 ]; then
  read -r stc_sb stc_host < <(best_pair 3 1 "$id" "$st_sb" "$st_host")
  read -r lsc_sb lsc_host < <(best_pair 3 1 "$id" "$ls_sb" "$ls_host")
  cold_row="| caches dropped (best of 3) | $((stc_sb / 1000)) ms | $((stc_host / 1000)) ms | $(ratio "$stc_sb" "$stc_host")x | $((lsc_sb / 1000)) ms | $((lsc_host / 1000)) ms | $(ratio "$lsc_sb" "$lsc_host")x |"
fi
nfiles=$(find "$work/rootfs/usr" | wc -l)
echo "**Listing and statting /usr** ($nfiles entries; \`$st_sb\` stats each entry, \`$ls_sb\` also reads two xattrs per entry and every symlink) in the sandbox vs over the same tree unpacked on the host, alternated:"
echo
echo "| | sandbox find | host find | sandbox / host | sandbox ls -lR | host ls -lR | sandbox / host |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
echo "| caches warm (best of 5) | $((stw_sb / 1000)) ms | $((stw_host / 1000)) ms | $(ratio "$stw_sb" "$stw_host")x | $((lsw_sb / 1000)) ms | $((lsw_host / 1000)) ms | $(ratio "$lsw_sb" "$lsw_host")x |"
[ -z "$cold_row" ] || echo "$cold_row"
echo
echo "Targets: read >= 0.80 of the host's; listing and statting <= 2x the host's."
fi
