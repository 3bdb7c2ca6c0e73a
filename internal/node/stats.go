package node

import (
	"fmt"
	goruntime "runtime"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/reclaim"
)

// StatsSampler turns cgroup readings into SandboxStats with the reclaim
// package's accounting (one implementation of held/reclaimable for the
// API, /metrics, admission and the reclaim controller) and keeps the
// window of CPU readings whose p95 admission sums.
type StatsSampler struct {
	CgroupVersion int

	cpu *reclaim.CPUSampler
	// readSwap reports whether the node has free swap: cold anon counts
	// as reclaimable only when it has somewhere to go. Its answer is kept
	// for a second, since Info fills every sandbox in a row.
	readSwap func() bool
	now      func() time.Time

	mu       sync.Mutex
	swapAt   time.Time
	swapLast bool
}

// NewStatsSampler keeps CPU readings of the last window per sandbox;
// readings closer together than minInterval are ignored (a stats call
// right after the sampling loop's would otherwise give a noisy rate).
func NewStatsSampler(cgroupVersion int, window, minInterval time.Duration) (*StatsSampler, error) {
	cpu, err := reclaim.NewCPUSampler(window, minInterval)
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	return &StatsSampler{
		CgroupVersion: cgroupVersion, cpu: cpu, now: time.Now,
		readSwap: func() bool {
			n, err := reclaim.ReadNode("/proc/meminfo")
			return err == nil && n.SwapAvailable
		},
	}, nil
}

// SwapAvailable reports whether the node has free swap now (cached 1s).
func (s *StatsSampler) SwapAvailable() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now := s.now(); now.Sub(s.swapAt) >= time.Second || now.Before(s.swapAt) {
		s.swapLast, s.swapAt = s.readSwap(), now
	}
	return s.swapLast
}

// Observe records a cumulative CPU reading of the sandbox.
func (s *StatsSampler) Observe(id string, cs *cgroups.Stats) {
	s.ObserveCPU(id, cs.CPUUsageNanos)
}

// ObserveCPU records a cumulative CPU time reading (nanoseconds).
func (s *StatsSampler) ObserveCPU(id string, usageNanos uint64) {
	s.cpu.Observe(id, s.now(), usageNanos)
}

// CPU returns the sandbox's measured CPU (Samples < 2: not measured yet).
func (s *StatsSampler) CPU(id string) reclaim.CPU { return s.cpu.CPU(id) }

// Forget drops a deleted sandbox's history.
func (s *StatsSampler) Forget(id string) { s.cpu.Forget(id) }

// Fill observes cs and fills out from it.
func (s *StatsSampler) Fill(id string, cs *cgroups.Stats, out *SandboxStats) {
	s.Observe(id, cs)
	c := s.cpu.CPU(id)
	out.CPUUsed, out.CPUUsedP50, out.CPUUsedP95 = c.Rate, c.P50, c.P95
	FillMemory(cs, s.SwapAvailable(), out)
}

// FillMemory fills the memory, pid and pressure fields of out from cgroup
// stats with reclaim.MemoryOf. swapAvailable decides whether cold anon is
// reclaimable.
func FillMemory(cs *cgroups.Stats, swapAvailable bool, out *SandboxStats) {
	m := reclaim.MemoryOf(cs, swapAvailable)
	out.CPUUsageSeconds = float64(cs.CPUUsageNanos) / 1e9
	out.CPUThrottledSeconds = float64(cs.CPUThrottledNanos) / 1e9
	out.MemoryLimitBytes = int64(cs.MemoryLimit)
	out.MemoryHeldBytes = m.Held
	out.MemoryReclaimableBytes = m.Reclaimable
	out.MemoryAnonBytes = m.Anon
	out.MemoryFileBytes = m.File
	out.MemoryShmemBytes = m.Shmem
	out.MemoryKernelBytes = m.Kernel
	out.MemorySwappedBytes = m.Swapped
	out.MemoryReusableBytes = m.Reusable
	out.MemoryCompressedBytes = m.Compressed
	out.PidsCurrent = int64(cs.PidsCurrent)
	out.OOMKills = int64(cs.OOMKills)
	if cs.HasPSI {
		out.MemoryPressureAvg10 = cs.MemoryPressure.Some.Avg10
		out.CPUPressureAvg10 = cs.CPUPressure.Some.Avg10
	}
}

func numCPU() int { return goruntime.NumCPU() }

// diskUsager is a runtime that measures a sandbox's private layer itself
// (cheaper than walking it, e.g. from a quota).
type diskUsager interface {
	DiskUsage(id string) (int64, error)
}
