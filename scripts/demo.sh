#!/usr/bin/env bash
# The main job, end to end on this machine: start a server, import a small
# real rootfs, create 100 sandboxes, have each edit a file and run a command
# in its workspace, then show what the node holds, and clean everything up.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${DSEC_BIN:-$PWD/bin/dsec}
N=${DEMO_N:-100}
P=${DEMO_PARALLEL:-4}
work=$(mktemp -d /tmp/dsec-demo.XXXXXX)
export DSEC_ADDR="unix://$work/dsec.sock"
server=
cleanup() {
  set +e
  if [ -n "$server" ]; then
    "$BIN" sandbox ls --json 2>/dev/null | python3 -c 'import json,sys; [print(s["id"]) for s in json.load(sys.stdin)]' | xargs -r -n 20 "$BIN" sandbox rm >/dev/null 2>&1
    kill "$server" 2>/dev/null; wait "$server" 2>/dev/null
  fi
  umount -R "$work/data" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

echo "== building a small real rootfs (busybox + bash)"
scripts/mkrootfs.sh "$work/rootfs"

echo "== starting dsec serve"
"$BIN" serve --data-dir "$work/data" --listen "$DSEC_ADDR" >"$work/serve.log" 2>&1 &
server=$!
for _ in $(seq 100); do [ -S "$work/dsec.sock" ] && break; sleep 0.1; done
[ -S "$work/dsec.sock" ] || { cat "$work/serve.log"; echo "server did not start" >&2; exit 1; }

echo "== importing the image"
"$BIN" image import demo:latest "$work/rootfs"
"$BIN" image ls

echo "== creating $N sandboxes ($P at a time); each edits a file and runs a command"
one() {
  id=$("$BIN" sandbox create --image demo:latest --cpu 0.5 --memory 64Mi --label job=demo)
  "$BIN" exec "$id" -- sh -c "echo 'patched by $id' >> /workspace/README && grep -c . /workspace/README" >/dev/null
  printf '%s\n' "$id"
}
export -f one; export BIN
start=$(date +%s.%N)
seq "$N" | xargs -P "$P" -I{} bash -c one >"$work/ids"
end=$(date +%s.%N)
echo "created and used $(wc -l <"$work/ids") sandboxes in $(python3 -c "print(round($end-$start,2))") s"

first=$(head -1 "$work/ids")
echo "== one workspace after its edit ($first):"
"$BIN" file get "$first" /workspace/README -
echo "== the image itself is unchanged: a fresh sandbox sees"
fresh=$("$BIN" sandbox create --image demo:latest)
"$BIN" exec "$fresh" -- cat /workspace/README
"$BIN" sandbox rm "$fresh"

echo "== what the node holds"
"$BIN" node ls
"$BIN" sandbox ls --label job=demo --json | python3 -c '
import json, sys
sbs = json.load(sys.stdin)
print("sandboxes running: %d" % sum(1 for s in sbs if s["state"] == "running"))'
"$BIN" node ls --json | python3 -c '
import json, sys
for n in json.load(sys.stdin):
    print("CPU requested: %.1f cores, used: %.3f cores" % (n["cpu_requested"], n["cpu_used"]))
    print("memory held by sandboxes: %.1f MiB (reclaimable %.1f MiB)" % (n["memory_held_bytes"] / 2**20, n["memory_reclaimable_bytes"] / 2**20))
    print("host MemAvailable: %.2f GiB of %.2f GiB" % (n["mem_available_bytes"] / 2**30, n["memory_bytes"] / 2**30))'
echo "== deleting them"
xargs -n 20 "$BIN" sandbox rm <"$work/ids" >/dev/null
echo "demo done"
