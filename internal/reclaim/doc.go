// Package reclaim holds dsec's node-local memory and CPU efficiency
// mechanisms. Policy (who is admitted where) lives in internal/scheduler;
// this package only measures and acts.
//
//   - Accounting: MemoryOf turns cgroups.Stats into held, reclaimable
//     (inactive file, plus inactive anon when swap exists), reusable (page
//     cache that is not shmem) and swapped/compressed bytes; ReadNode does
//     the same for the node from /proc/meminfo. CPUSampler keeps a time
//     window of cumulative CPU readings per sandbox and reports the last
//     rate and the p50/p95 of interval rates.
//   - Controller: for sandboxes idle longer than Config.IdleAfter, asks the
//     kernel for memory back one step per pass, scaling the step down as
//     the memory stall fraction (PSI "some" total, per group on v2, per
//     node on v1) nears a threshold and pausing above it, as Senpai does.
//     v2 writes memory.reclaim; v1 uses an instant lower hard limit with
//     the OOM killer disabled (cgroups.V1Group.Reclaim) and, once per idle
//     period, process_madvise(MADV_PAGEOUT) over the sandbox's mappings.
//     No limit is left changed, so waking or deleting a sandbox needs no
//     restore, and reclaim cannot OOM-kill.
//   - Zram: a compressed swap device set up and torn down entirely through
//     sysfs and swapon/swapoff (the swap header is written here), off unless
//     asked for (`--swap zram:SIZE`).
//   - DetectDAMON: whether a DAMON context could be started without
//     disturbing the system's.
//   - QoS: class -> cgroup weight/idle, SCHED_IDLE for batch tasks where
//     v1 lacks cpu.idle, core-scheduling detection; KSMDomain keeps KSM to
//     one tenant per node, since KSM merges system wide.
package reclaim
