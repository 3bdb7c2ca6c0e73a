package reclaim

import (
	"math"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

const mib = int64(1) << 20

func TestMemoryOf(t *testing.T) {
	s := &cgroups.Stats{
		MemoryUsage: uint64(100 * mib), Anon: uint64(60 * mib), File: uint64(30 * mib), Shmem: uint64(5 * mib),
		Kernel: uint64(4 * mib), InactiveAnon: uint64(40 * mib), ActiveAnon: uint64(20 * mib),
		InactiveFile: uint64(20 * mib), ActiveFile: uint64(5 * mib), Swap: uint64(7 * mib), Zswap: uint64(2 * mib),
	}
	tests := []struct {
		name string
		s    *cgroups.Stats
		swap bool
		want Memory
	}{
		{"no swap: only inactive file is reclaimable", s, false, Memory{Held: 100 * mib, Anon: 60 * mib, File: 30 * mib, Shmem: 5 * mib,
			Kernel: 4 * mib, Reclaimable: 20 * mib, Reusable: 25 * mib, Swapped: 7 * mib, Compressed: 2 * mib}},
		{"swap: cold anon too", s, true, Memory{Held: 100 * mib, Anon: 60 * mib, File: 30 * mib, Shmem: 5 * mib,
			Kernel: 4 * mib, Reclaimable: 60 * mib, Reusable: 25 * mib, Swapped: 7 * mib, Compressed: 2 * mib}},
		{"usage below parts (racy reads): held is the sum",
			&cgroups.Stats{MemoryUsage: uint64(10 * mib), Anon: uint64(8 * mib), File: uint64(4 * mib), Kernel: uint64(1 * mib)}, false,
			Memory{Held: 13 * mib, Anon: 8 * mib, File: 4 * mib, Kernel: mib, Reusable: 4 * mib}},
		{"shmem above file (v1 racy): reusable clamps at 0",
			&cgroups.Stats{File: 1, Shmem: 2}, false, Memory{Held: 1, File: 1, Shmem: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := MemoryOf(tc.s, tc.swap); got != tc.want {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestParseMeminfo(t *testing.T) {
	good := "MemTotal:       24684004 kB\nMemFree:        24400000 kB\nMemAvailable:   24300000 kB\nInactive(anon):     1000 kB\n" +
		"Inactive(file):    20000 kB\nShmem:     8000 kB\nSwapTotal:      65536 kB\nSwapFree:       65000 kB\nZswap:  0 kB\nZswapped: 0 kB\nHugePages_Total:       0\n"
	n, err := ParseMeminfo("meminfo", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	want := Node{Total: 24684004 << 10, Available: 24300000 << 10, Held: (24684004 - 24300000) << 10,
		InactiveFile: 20000 << 10, InactiveAnon: 1000 << 10, SwapTotal: 65536 << 10, SwapFree: 65000 << 10,
		Shmem: 8000 << 10, Reclaimable: 21000 << 10, SwapAvailable: true}
	if n != want {
		t.Fatalf("got %+v\nwant %+v", n, want)
	}
	for _, bad := range []string{
		"MemTotal: x kB\nMemAvailable: 1 kB\n",
		"MemTotal 5 kB\nMemAvailable: 1 kB\n",
		"MemTotal: 5 MB\nMemAvailable: 1 kB\n",
		"MemFree: 5 kB\n",
	} {
		if _, err := ParseMeminfo("meminfo", []byte(bad)); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: %v, want invalid argument", bad, err)
		}
	}
	if n, err := ReadNode("/proc/meminfo"); err != nil || n.Total <= 0 || n.Available <= 0 || n.Available > n.Total {
		t.Fatalf("ReadNode(/proc/meminfo) = %+v, %v", n, err)
	}
}

func TestCPUSampler(t *testing.T) {
	t0 := time.Unix(1000, 0)
	sec := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	const core = uint64(time.Second) // one core-second in ns
	type obs struct {
		at    float64
		usage uint64
	}
	tests := []struct {
		name   string
		window time.Duration
		obs    []obs
		want   CPU
	}{
		{"no readings", time.Minute, nil, CPU{}},
		{"one reading", time.Minute, []obs{{0, 0}}, CPU{Samples: 1}},
		{"steady half core", time.Minute, []obs{{0, 0}, {1, core / 2}, {2, core}, {3, 3 * core / 2}},
			CPU{Rate: 0.5, P50: 0.5, P95: 0.5, Samples: 4}},
		{"burst shows in p95, not p50", time.Minute,
			[]obs{{0, 0}, {1, core / 10}, {2, 2 * core / 10}, {3, 3 * core / 10}, {4, 4 * core / 10}, {5, 4*core/10 + 2*core}},
			CPU{Rate: 2, P50: 0.1, P95: 2, Samples: 6}},
		{"window drops old intervals", 10 * time.Second,
			[]obs{{0, 0}, {5, 10 * core}, {10, 10 * core}, {15, 10 * core}, {20, 10 * core}},
			CPU{Rate: 0, P50: 0, P95: 0, Samples: 3}},
		{"too-close reading ignored", time.Minute, []obs{{0, 0}, {1, core}, {1.01, core + core/100*50}},
			CPU{Rate: 1, P50: 1, P95: 1, Samples: 2}},
		{"counter reset restarts", time.Minute, []obs{{0, 0}, {1, 5 * core}, {2, core / 10}, {3, core/10 + core/4}},
			CPU{Rate: 0.25, P50: 0.25, P95: 0.25, Samples: 2}},
		{"out of order ignored", time.Minute, []obs{{0, 0}, {2, core}, {1, core}},
			CPU{Rate: 0.5, P50: 0.5, P95: 0.5, Samples: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewCPUSampler(tc.window, 100*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range tc.obs {
				s.Observe("a", sec(o.at), o.usage)
			}
			got := s.CPU("a")
			if !near(got.Rate, tc.want.Rate) || !near(got.P50, tc.want.P50) || !near(got.P95, tc.want.P95) || got.Samples != tc.want.Samples {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestCPUSamplerSumAndForget(t *testing.T) {
	s, err := NewCPUSampler(time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(0, 0)
	for i := 0; i <= 20; i++ {
		at := t0.Add(time.Duration(i) * time.Second)
		s.Observe("a", at, uint64(i)*uint64(time.Second)/4) // 0.25 core
		s.Observe("b", at, uint64(i)*uint64(time.Second))   // 1 core
	}
	if got := s.SumP95(); !near(got, 1.25) {
		t.Fatalf("SumP95 = %v", got)
	}
	s.Forget("b")
	if got := s.SumP95(); !near(got, 0.25) {
		t.Fatalf("SumP95 after Forget = %v", got)
	}
	for _, bad := range [][2]time.Duration{{0, 0}, {time.Second, time.Second}, {time.Second, -1}} {
		if _, err := NewCPUSampler(bad[0], bad[1]); !errdefs.IsInvalidArgument(err) {
			t.Errorf("NewCPUSampler(%v, %v): %v", bad[0], bad[1], err)
		}
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

// A real process in a real v1 cgroup touches 64 MiB of anon memory and
// reads a 32 MiB file: the accounting must show both.
func TestAccountingRealV1(t *testing.T) {
	g := v1Group(t, cgroups.Resources{MemoryLimit: 1 << 30})
	file := diskFile(t, int(32*mib))
	h := startHelper(t, g, "ALLOC_MIB=64", "READ_FILE="+file)
	// memcg statistics are flushed lazily (within ~2s).
	var m Memory
	waitUntil(t, "stats show the allocations", 5*time.Second, func() bool {
		st, err := g.Stats()
		if err != nil {
			t.Fatal(err)
		}
		m = MemoryOf(st, false)
		return m.Anon >= 64*mib && m.File >= 32*mib
	})
	t.Logf("held %d anon %d file %d kernel %d reclaimable %d", m.Held>>20, m.Anon>>20, m.File>>20, m.Kernel>>20, m.Reclaimable>>20)
	// The Go runtime of the helper adds a few MiB of its own anon memory.
	within := func(name string, got, lo, hi int64) {
		if got < lo || got > hi {
			t.Errorf("%s = %d MiB, want %d..%d MiB", name, got>>20, lo>>20, hi>>20)
		}
	}
	within("anon", m.Anon, 64*mib, 64*mib+24*mib)
	within("file", m.File, 32*mib, 32*mib+4*mib)
	within("held", m.Held, m.Anon+m.File, m.Anon+m.File+16*mib)
	within("reclaimable (no swap: inactive file)", m.Reclaimable, 28*mib, 36*mib)
	within("reusable", m.Reusable, 32*mib, 36*mib)
	if m.Kernel <= 0 {
		t.Errorf("kernel memory %d, want > 0 (page tables, stacks)", m.Kernel)
	}
	if m.Swapped != 0 {
		t.Errorf("swapped %d without swap", m.Swapped)
	}
	pm, err := ReadProcMemory(h.pid())
	if err != nil {
		t.Fatal(err)
	}
	within("process RssAnon", pm.RssAnon, 64*mib, 64*mib+24*mib)
}

func BenchmarkCPUSampler(b *testing.B) {
	s, err := NewCPUSampler(5*time.Minute, 0)
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Unix(0, 0)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		// 300 readings per window: one every second for 5 minutes.
		s.Observe("sb", t0.Add(time.Duration(i)*time.Second), uint64(i)*uint64(time.Millisecond))
		if i%10 == 0 {
			_ = s.CPU("sb")
		}
	}
}
