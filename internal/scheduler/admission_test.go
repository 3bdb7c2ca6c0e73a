package scheduler

import (
	"errors"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

const gib = int64(1) << 30

func node() NodeUsage {
	return NodeUsage{CPUs: 2, CPUUsedP95: 1.0, MemoryTotal: 24 * gib, MemoryHeld: 4 * gib,
		PidsMax: 10000, PidsUsed: 500, DiskTotal: 100 * gib, DiskUsed: 10 * gib, Sandboxes: 3}
}

func TestAdmit(t *testing.T) {
	pol := DefaultPolicy() // 4x cpu, 512 MiB reserve
	tests := []struct {
		name    string
		node    func(n *NodeUsage)
		shape   Shape
		policy  func(p *Policy)
		ok      bool
		short   string
		mention string
	}{
		{name: "fits", shape: Shape{CPU: 1, MemoryBytes: gib}, ok: true},
		{name: "requests above capacity but measured use low",
			node:  func(n *NodeUsage) { n.CPUUsedP95 = 0.2 },
			shape: Shape{CPU: 4, ExpectedCPU: 0.1, MemoryBytes: 16 * gib, ExpectedMemory: gib}, ok: true},
		{name: "cpu short", node: func(n *NodeUsage) { n.CPUUsedP95 = 7.5 }, shape: Shape{CPU: 1, MemoryBytes: gib},
			short: ResourceCPU, mention: "7.50 + expected 1.00 cores exceeds capacity 8.00"},
		{name: "cpu exactly at capacity is admitted", node: func(n *NodeUsage) { n.CPUUsedP95 = 7 }, shape: Shape{CPU: 1, MemoryBytes: gib}, ok: true},
		{name: "memory short", node: func(n *NodeUsage) { n.MemoryHeld = 23 * gib }, shape: Shape{CPU: 0.5, MemoryBytes: gib},
			short: ResourceMemory, mention: "reserve 512 MiB"},
		{name: "memory: expected fraction lets it in",
			node:   func(n *NodeUsage) { n.MemoryHeld = 23 * gib },
			policy: func(p *Policy) { p.ExpectedMemoryFraction = 0.25 },
			shape:  Shape{CPU: 0.5, MemoryBytes: gib}, ok: true},
		{name: "pids short", node: func(n *NodeUsage) { n.PidsUsed = 9990 }, shape: Shape{CPU: 0.5, MemoryBytes: gib, Pids: 64},
			short: ResourcePids},
		{name: "disk short", node: func(n *NodeUsage) { n.DiskUsed = 99 * gib }, shape: Shape{CPU: 0.5, MemoryBytes: gib, DiskBytes: 2 * gib},
			short: ResourceDisk},
		{name: "sandbox cap", policy: func(p *Policy) { p.MaxSandboxes = 3 }, shape: Shape{CPU: 0.5, MemoryBytes: gib},
			short: ResourceSandboxes},
		{name: "cpu reported before memory when both short",
			node:  func(n *NodeUsage) { n.CPUUsedP95, n.MemoryHeld = 8, 24*gib },
			shape: Shape{CPU: 1, MemoryBytes: gib}, short: ResourceCPU},
		{name: "untracked pids do not limit", node: func(n *NodeUsage) { n.PidsMax = 0 }, shape: Shape{CPU: 0.5, MemoryBytes: gib, Pids: 1 << 40}, ok: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, p := node(), pol
			if tc.node != nil {
				tc.node(&n)
			}
			if tc.policy != nil {
				tc.policy(&p)
			}
			ok, reason := Admit(n, tc.shape, p)
			if ok != tc.ok {
				t.Fatalf("Admit = %v (%s), want %v", ok, reason, tc.ok)
			}
			err := Check(n, tc.shape, p)
			if tc.ok {
				if err != nil || reason != "" {
					t.Fatalf("admitted with reason %q / err %v", reason, err)
				}
				return
			}
			if !errdefs.IsResourceExhausted(err) || ShortResource(err) != tc.short {
				t.Fatalf("Check = %v (short %q), want resource exhausted on %q", err, ShortResource(err), tc.short)
			}
			if !strings.HasPrefix(reason, tc.short+": ") || !strings.Contains(reason, tc.mention) {
				t.Fatalf("reason %q does not start with %q or lacks %q", reason, tc.short, tc.mention)
			}
		})
	}
}

func TestInvalidInput(t *testing.T) {
	n := node()
	tests := []struct {
		name  string
		shape Shape
		pol   func(p *Policy)
	}{
		{name: "negative cpu", shape: Shape{CPU: -1, MemoryBytes: gib}},
		{name: "no cpu", shape: Shape{MemoryBytes: gib}},
		{name: "no memory", shape: Shape{CPU: 1}},
		{name: "negative memory", shape: Shape{CPU: 1, MemoryBytes: -1}},
		{name: "expected above limit", shape: Shape{CPU: 1, MemoryBytes: gib, ExpectedMemory: 2 * gib}},
		{name: "zero overcommit", shape: Shape{CPU: 1, MemoryBytes: gib}, pol: func(p *Policy) { p.CPUOvercommit = 0 }},
		{name: "fraction above 1", shape: Shape{CPU: 1, MemoryBytes: gib}, pol: func(p *Policy) { p.ExpectedCPUFraction = 2 }},
		{name: "negative reserve", shape: Shape{CPU: 1, MemoryBytes: gib}, pol: func(p *Policy) { p.MemoryReserve = -1 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := DefaultPolicy()
			if tc.pol != nil {
				tc.pol(&p)
			}
			err := Check(n, tc.shape, p)
			if !errdefs.IsInvalidArgument(err) || errdefs.IsResourceExhausted(err) {
				t.Fatalf("Check = %v, want invalid argument", err)
			}
			if ok, reason := Admit(n, tc.shape, p); ok || reason == "" {
				t.Fatalf("Admit = %v %q", ok, reason)
			}
			if fits, lim, _ := Capacity(n, tc.shape, p); fits != 0 || lim != "invalid" {
				t.Fatalf("Capacity = %d %q", fits, lim)
			}
		})
	}
}

func TestCapacity(t *testing.T) {
	tests := []struct {
		name     string
		node     NodeUsage
		shape    Shape
		policy   Policy
		fits     int
		limiting string
		per      map[string]int
	}{
		{
			name:  "cpu limits",
			node:  NodeUsage{CPUs: 2, CPUUsedP95: 1, MemoryTotal: 24 * gib, MemoryHeld: 4 * gib},
			shape: Shape{CPU: 0.5, MemoryBytes: gib}, policy: DefaultPolicy(),
			// cpu: (8-1)/0.5 = 14; memory: (24-0.5-4)/1 = 19
			fits: 14, limiting: ResourceCPU, per: map[string]int{ResourceCPU: 14, ResourceMemory: 19},
		},
		{
			name:  "memory limits",
			node:  NodeUsage{CPUs: 2, MemoryTotal: 24 * gib, MemoryHeld: 4 * gib},
			shape: Shape{CPU: 0.1, MemoryBytes: 4 * gib}, policy: DefaultPolicy(),
			fits: 4, limiting: ResourceMemory, per: map[string]int{ResourceCPU: 80, ResourceMemory: 4},
		},
		{
			name:   "pids and cap",
			node:   NodeUsage{CPUs: 2, MemoryTotal: 24 * gib, PidsMax: 1000, PidsUsed: 900, Sandboxes: 8},
			shape:  Shape{CPU: 0.1, MemoryBytes: 64 << 20, Pids: 30},
			policy: func() Policy { p := DefaultPolicy(); p.MaxSandboxes = 20; return p }(),
			fits:   3, limiting: ResourcePids, per: map[string]int{ResourceCPU: 80, ResourceMemory: 376, ResourcePids: 3, ResourceSandboxes: 12},
		},
		{
			name:  "full",
			node:  NodeUsage{CPUs: 2, CPUUsedP95: 9, MemoryTotal: 24 * gib},
			shape: Shape{CPU: 1, MemoryBytes: gib}, policy: DefaultPolicy(),
			fits: 0, limiting: ResourceCPU, per: map[string]int{ResourceCPU: 0, ResourceMemory: 23},
		},
		{
			name:  "nothing measured",
			node:  NodeUsage{},
			shape: Shape{CPU: 1, MemoryBytes: gib}, policy: DefaultPolicy(),
			fits: 0, limiting: "unknown", per: map[string]int{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fits, lim, per := Capacity(tc.node, tc.shape, tc.policy)
			if fits != tc.fits || lim != tc.limiting {
				t.Fatalf("Capacity = %d %q, want %d %q (per %v)", fits, lim, tc.fits, tc.limiting, per)
			}
			if len(per) != len(tc.per) {
				t.Fatalf("per = %v, want %v", per, tc.per)
			}
			for k, v := range tc.per {
				if per[k] != v {
					t.Fatalf("per[%s] = %d, want %d (all %v)", k, per[k], v, per)
				}
			}
		})
	}
}

// Capacity and Admit agree: admitting `fits` sandboxes one by one (each
// adding its expected use to the node) succeeds, and the next is refused
// on the resource Capacity named.
func TestCapacityMatchesAdmit(t *testing.T) {
	shapes := []Shape{
		{CPU: 0.5, MemoryBytes: gib},
		{CPU: 0.25, MemoryBytes: 3 * gib, Pids: 100},
		{CPU: 2, ExpectedCPU: 0.3, MemoryBytes: 8 * gib, ExpectedMemory: 512 << 20, DiskBytes: 5 * gib},
		{CPU: 0.1, MemoryBytes: 100 << 20},
	}
	for i, s := range shapes {
		n, p := node(), DefaultPolicy()
		p.MaxSandboxes = 200
		fits, lim, _ := Capacity(n, s, p)
		cpu, mem := s.expected(p)
		for k := 0; k < fits; k++ {
			if err := Check(n, s, p); err != nil {
				t.Fatalf("shape %d: sandbox %d of %d refused: %v", i, k+1, fits, err)
			}
			n.CPUUsedP95 += cpu
			n.MemoryHeld += mem
			n.PidsUsed += s.Pids
			n.DiskUsed += s.DiskBytes
			n.Sandboxes++
		}
		err := Check(n, s, p)
		if err == nil || ShortResource(err) != lim {
			t.Fatalf("shape %d: after %d admitted: %v, want refusal on %s", i, fits, err, lim)
		}
		if f, _, _ := Capacity(n, s, p); f != 0 {
			t.Fatalf("shape %d: capacity after filling = %d", i, f)
		}
	}
}

func TestShortResourceOfOtherErrors(t *testing.T) {
	if ShortResource(errors.New("x")) != "" || ShortResource(nil) != "" {
		t.Fatal("ShortResource of a non-refusal")
	}
}
