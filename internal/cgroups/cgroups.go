// Package cgroups puts cgroup v1 and v2 behind one small interface. A
// Manager creates and loads Groups under a root (the real /sys/fs/cgroup or a
// fake tree in tests); a Group applies Resources and reports Stats.
//
// Callers never look at cgroupfs paths except through Group.Paths, which the
// runtime hands to its exec shim so a new process joins the group before it
// runs any sandbox code.
package cgroups

import "context"

// Resources are the knobs dsec sets. Zero values mean "leave unlimited" or
// "kernel default".
type Resources struct {
	// CPUWeight is the v2 weight (1..10000, default 100); v1 maps it to
	// cpu.shares (weight*1024/100).
	CPUWeight uint64
	// CPUQuotaMicros / CPUPeriodMicros set a hard CPU limit. 0 quota = none.
	CPUQuotaMicros  int64
	CPUPeriodMicros uint64
	// CPUIdle marks the group as batch (v2 cpu.idle=1; v1 falls back to
	// SCHED_IDLE on its tasks, done by the caller, and minimum shares).
	CPUIdle bool
	// MemoryLimit in bytes (memory.max / memory.limit_in_bytes). 0 = none.
	MemoryLimit int64
	// MemoryHigh is the v2 throttle point used by proactive reclaim on v1 as
	// a soft limit. 0 = none.
	MemoryHigh int64
	// SwapLimit in bytes of swap beyond memory (v2 memory.swap.max). -1 = unlimited.
	SwapLimit int64
	// PidsLimit (pids.max). 0 = none.
	PidsLimit int64
}

// PSI is one pressure line of a /proc/pressure-style file.
type PSI struct {
	Avg10, Avg60, Avg300 float64
	TotalMicros          uint64
}

// Pressure holds "some" and "full" lines for one resource.
type Pressure struct {
	Some, Full PSI
}

// Stats is what a Group reports. Fields a cgroup version cannot provide are
// zero; HasPSI says whether the pressure fields are real.
type Stats struct {
	CPUUsageNanos     uint64
	CPUThrottledNanos uint64
	CPUNrThrottled    uint64

	MemoryUsage    uint64 // usage incl. page cache
	MemoryLimit    uint64 // 0 = unlimited
	MemoryMaxUsage uint64
	Anon           uint64
	File           uint64
	Shmem          uint64
	Kernel         uint64
	ActiveAnon     uint64
	InactiveAnon   uint64
	ActiveFile     uint64
	InactiveFile   uint64
	Swap           uint64
	OOMKills       uint64
	// Zswap is the compressed size of the group's pages in the zswap pool
	// and Zswapped their uncompressed size (v2 memory.stat; 0 on v1).
	Zswap    uint64
	Zswapped uint64

	PidsCurrent uint64
	PidsLimit   uint64

	HasPSI         bool
	CPUPressure    Pressure
	MemoryPressure Pressure
	IOPressure     Pressure
}

// Manager creates and finds groups. Names are slash-separated paths relative
// to the manager's root, e.g. "dsec/sandboxes/sb-123".
type Manager interface {
	// Version is 1 or 2.
	Version() int
	New(ctx context.Context, name string, r Resources) (Group, error)
	Load(ctx context.Context, name string) (Group, error)
}

// Group is one cgroup (on v1: the same name in every controller hierarchy).
type Group interface {
	Name() string
	// Paths maps controller name (v1) or "" (v2 unified) to the directory.
	Paths() map[string]string
	AddProc(pid int) error
	Procs() ([]int, error)
	Set(r Resources) error
	Stats() (*Stats, error)
	Freeze(ctx context.Context) error
	Thaw(ctx context.Context) error
	// Kill sends SIGKILL to every process in the group and waits until it is empty.
	Kill(ctx context.Context) error
	// Delete removes the group; it must be empty.
	Delete(ctx context.Context) error
}

// CPUUsager is implemented by groups that can read their cumulative CPU
// time alone: one file instead of the dozen Stats reads, for samplers that
// visit every sandbox every few seconds.
type CPUUsager interface {
	CPUUsage() (nanos uint64, err error)
}

// Reclaimer is implemented by groups that can be asked to reclaim memory
// (v2 memory.reclaim). Callers detect it with a type assertion.
type Reclaimer interface {
	Reclaim(bytes int64) error
}

// Additions below are additive to the original skeleton.

// Both versions implement Reclaimer: v2 writes memory.reclaim; v1 has no such
// file, so it lowers memory.limit_in_bytes by the asked amount (the kernel
// reclaims synchronously to reach it, or refuses with EBUSY), with the group's
// OOM killer disabled for that instant, and restores limit and OOM setting
// right after. Neither path can OOM-kill the group.

// Option configures a Manager (NewV1, NewV2, Detect).
type Option func(*options) error
