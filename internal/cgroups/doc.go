// Design notes.
//
// Both backends write cgroupfs files directly instead of going through
// opencontainers/cgroups or containerd/cgroups: a sandbox create has a
// budget of a few milliseconds, and those libraries parse mountinfo, stat
// and validate every knob and write defaults we do not need. Here New does
// one mkdir per hierarchy plus one write per non-default knob (a fresh
// cgroup already holds the defaults); Set writes every knob so that it can
// also restore defaults.
//
// Files are opened without O_CREAT: a missing file is a missing controller
// or kernel feature and surfaces as an error (wrapping errdefs classes),
// never as a stray file. Kernel files that do not parse give
// errdefs.ErrInvalidArgument naming file and line.
//
// v1: controllers cpu, cpuacct, memory, pids and freezer under
// root/<controller> (co-mounted hierarchies such as cpu,cpuacct are handled
// once). Kill freezes before listing pids so nothing forks between listing
// and killing, and lists the union of every hierarchy's cgroup.procs.
// Reclaim lowers memory.limit_in_bytes for an instant with the OOM killer
// disabled, which is the closest v1 has to memory.reclaim.
//
// v2: one unified directory; parents delegate cpu, memory and pids through
// cgroup.subtree_control (cached per manager). Freeze waits on
// cgroup.events, Kill uses cgroup.kill, Reclaim writes memory.reclaim, and
// Stats include PSI when the kernel exposes it.
//
// Tests run v1 against the host's real hierarchies (root) and v2 against
// fake trees whose mkdir/rmdir populate the files the kernel would.
package cgroups
