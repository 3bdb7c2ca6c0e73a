package node

import (
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/cgroups"
)

func TestStatsSamplerRates(t *testing.T) {
	s, err := NewStatsSampler(1, time.Minute, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	swapReads := 0
	s.readSwap = func() bool { swapReads++; return true }
	var out SandboxStats
	usage := uint64(0)
	for i, rate := range []float64{0.5, 0.5, 0.5, 2} {
		usage += uint64(rate * 2e9)
		if i == 0 {
			s.Fill("a", &cgroups.Stats{CPUUsageNanos: 0}, &out)
		}
		now = now.Add(2 * time.Second)
		s.Fill("a", &cgroups.Stats{CPUUsageNanos: usage, InactiveAnon: 1 << 20}, &out)
	}
	if out.CPUUsed != 2 || out.CPUUsedP50 != 0.5 || out.CPUUsedP95 != 2 {
		t.Fatalf("rate %v p50 %v p95 %v", out.CPUUsed, out.CPUUsedP50, out.CPUUsedP95)
	}
	if out.MemoryReclaimableBytes != 1<<20 {
		t.Fatalf("with swap, inactive anon is reclaimable: %d", out.MemoryReclaimableBytes)
	}
	// A reading right after another is ignored, not turned into a rate.
	now = now.Add(10 * time.Millisecond)
	s.Fill("a", &cgroups.Stats{CPUUsageNanos: usage + 1e9}, &out)
	if out.CPUUsed != 2 {
		t.Fatalf("a reading 10ms later changed the rate to %v", out.CPUUsed)
	}
	if swapReads != 5 {
		t.Fatalf("swap state read %d times, want once per reading 2s apart and not for one 10ms later (5)", swapReads)
	}
	s.Forget("a")
	if c := s.CPU("a"); c.Samples != 0 {
		t.Fatalf("forgotten sandbox still has %d samples", c.Samples)
	}
}

func TestStatsSamplerBadWindow(t *testing.T) {
	if _, err := NewStatsSampler(1, time.Second, time.Minute); err == nil {
		t.Fatal("a min interval above the window must be refused")
	}
}
