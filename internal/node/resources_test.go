package node

import (
	"testing"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

func TestResourcesClasses(t *testing.T) {
	for _, tc := range []struct {
		name          string
		spec          SandboxSpec
		taskSchedIdle bool
		weight        uint64
		idle          bool
		quota         int64
	}{
		{"standard scales with request", SandboxSpec{QoS: QoSStandard, CPU: 2}, false, 200, false, 0},
		{"empty is standard", SandboxSpec{CPU: 1}, false, 100, false, 0},
		{"latency is 10x standard", SandboxSpec{QoS: QoSLatency, CPU: 1}, false, 1000, false, 0},
		{"latency capped at the kernel's max", SandboxSpec{QoS: QoSLatency, CPU: 64}, false, 10000, false, 0},
		{"tiny request keeps a weight", SandboxSpec{QoS: QoSStandard, CPU: 0.001}, false, 1, false, 0},
		{"batch is cpu.idle", SandboxSpec{QoS: QoSBatch, CPU: 4}, false, 0, true, 0},
		{"batch without cpu.idle: minimum weight, tasks made SCHED_IDLE", SandboxSpec{QoS: QoSBatch, CPU: 4}, true, 1, false, 0},
		{"limit sets a quota", SandboxSpec{QoS: QoSStandard, CPU: 1, CPULimit: 1.5}, false, 100, false, 150000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.spec.MemoryBytes, tc.spec.Pids = 64<<20, 100
			r, err := resources(tc.spec, tc.taskSchedIdle)
			if err != nil {
				t.Fatal(err)
			}
			if r.CPUWeight != tc.weight || r.CPUIdle != tc.idle || r.CPUQuotaMicros != tc.quota {
				t.Fatalf("got weight %d idle %v quota %d, want %d %v %d", r.CPUWeight, r.CPUIdle, r.CPUQuotaMicros, tc.weight, tc.idle, tc.quota)
			}
			if r.MemoryLimit != 64<<20 || r.PidsLimit != 100 || r.SwapLimit != 64<<20 {
				t.Fatalf("limits not carried: %+v", r)
			}
		})
	}
}

// Swap is bounded by the memory limit (a memory bomb on a host with swap
// is killed at twice its limit); without a memory limit it is not bounded
// either.
func TestResourcesSwapBound(t *testing.T) {
	for _, tc := range []struct {
		mem, swap int64
	}{{64 << 20, 64 << 20}, {1 << 30, 1 << 30}, {0, -1}} {
		r, err := resources(SandboxSpec{CPU: 1, MemoryBytes: tc.mem}, false)
		if err != nil {
			t.Fatal(err)
		}
		if r.SwapLimit != tc.swap {
			t.Errorf("memory %d: swap limit %d, want %d", tc.mem, r.SwapLimit, tc.swap)
		}
	}
}

func TestResourcesBadClass(t *testing.T) {
	if _, err := resources(SandboxSpec{QoS: "realtime", CPU: 1}, false); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("want invalid argument, got %v", err)
	}
}

// FillMemory must agree with known cgroup figures: held never below its
// parts, cold anon reclaimable only with swap, shmem not reusable.
func TestFillMemory(t *testing.T) {
	cs := &cgroups.Stats{
		CPUUsageNanos: 3e9, CPUThrottledNanos: 5e8, MemoryLimit: 512 << 20,
		MemoryUsage: 90 << 20, Anon: 32 << 20, File: 64 << 20, Shmem: 8 << 20, Kernel: 2 << 20,
		InactiveFile: 40 << 20, InactiveAnon: 20 << 20, Swap: 4 << 20, PidsCurrent: 3, OOMKills: 1,
	}
	var out SandboxStats
	FillMemory(cs, false, &out)
	if out.MemoryHeldBytes != 98<<20 {
		t.Errorf("held %d, want anon+file+kernel %d (usage is lower)", out.MemoryHeldBytes, 98<<20)
	}
	if out.MemoryReclaimableBytes != 40<<20 {
		t.Errorf("reclaimable without swap %d, want inactive file only", out.MemoryReclaimableBytes)
	}
	if out.MemoryReusableBytes != 56<<20 {
		t.Errorf("reusable %d, want file - shmem", out.MemoryReusableBytes)
	}
	if out.MemorySwappedBytes != 4<<20 || out.PidsCurrent != 3 || out.OOMKills != 1 || out.CPUUsageSeconds != 3 || out.CPUThrottledSeconds != 0.5 {
		t.Errorf("counters: %+v", out)
	}
	FillMemory(cs, true, &out)
	if out.MemoryReclaimableBytes != 60<<20 {
		t.Errorf("reclaimable with swap %d, want inactive file + inactive anon", out.MemoryReclaimableBytes)
	}
}
