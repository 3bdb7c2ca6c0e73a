# benchlib.sh: helpers shared by the benchmark scripts (sourced, root).

# rm_all_sandboxes BIN [PARALLEL]: deletes every sandbox the server at
# $DSEC_ADDR lists, PARALLEL (default 1) batches of 100 at a time.
rm_all_sandboxes() {
  "$1" sandbox ls --json 2>/dev/null | python3 -c 'import json,sys; [print(s["id"]) for s in json.load(sys.stdin)]' |
    xargs -r -n 100 -P "${2:-1}" "$1" sandbox rm >/dev/null 2>&1
}

# shrink_slabs frees slab pages that earlier runs left empty, and drops
# caches: the kernel objects of new sandboxes (memory cgroups' shrinker
# slots above all) otherwise reuse them without lowering MemAvailable, and
# a density figure depends on the host's history.
shrink_slabs() {
  sync
  echo 3 >/proc/sys/vm/drop_caches
  for f in /sys/kernel/slab/*/shrink; do echo 1 >"$f" 2>/dev/null || true; done
}
