package node

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
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

// The tracked sandboxes' sums follow every change: tracking, samples,
// re-tracking, forgetting, pruning, and the sandboxes left out.
func TestStatsSamplerResidentCPU(t *testing.T) {
	type step struct {
		name   string
		do     func(s *StatsSampler, adv func(time.Duration))
		except []string
		want   ResidentCPU
	}
	// observe gives id two readings 2s apart at rate cores (p95 = rate).
	observe := func(id string, rate float64) func(*StatsSampler, func(time.Duration)) {
		return func(s *StatsSampler, adv func(time.Duration)) {
			base := uint64(s.cpu.CPU(id).Samples) * 1e12 // keeps the counter rising
			s.ObserveCPU(id, base)
			adv(2 * time.Second)
			s.ObserveCPU(id, base+uint64(rate*2e9))
		}
	}
	var gen uint64
	steps := []step{
		{name: "nothing tracked", do: func(*StatsSampler, func(time.Duration)) {}, want: ResidentCPU{}},
		{name: "two unmeasured of one request, one of another", do: func(s *StatsSampler, _ func(time.Duration)) {
			s.Track("a", 1)
			s.Track("b", 1)
			s.Track("c", 0.5)
		}, want: ResidentCPU{Sandboxes: 3, Unmeasured: []RequestCount{{0.5, 1}, {1, 2}}}},
		{name: "tracking again counts once", do: func(s *StatsSampler, _ func(time.Duration)) {
			s.Track("a", 1)
			s.Track("c", 0.5)
		}, want: ResidentCPU{Sandboxes: 3, Unmeasured: []RequestCount{{0.5, 1}, {1, 2}}}},
		{name: "one reading is not a measurement", do: func(s *StatsSampler, _ func(time.Duration)) {
			s.ObserveCPU("a", 0)
		}, want: ResidentCPU{Sandboxes: 3, Unmeasured: []RequestCount{{0.5, 1}, {1, 2}}}},
		{name: "a second reading measures it", do: func(s *StatsSampler, adv func(time.Duration)) {
			adv(2 * time.Second)
			s.ObserveCPU("a", 5e8) // 0.25 cores
		}, want: ResidentCPU{Sandboxes: 3, Measured: 1, MeasuredP95: 0.25, Unmeasured: []RequestCount{{0.5, 1}, {1, 1}}}},
		{name: "a busier sample raises its p95", do: func(s *StatsSampler, adv func(time.Duration)) {
			adv(2 * time.Second)
			s.ObserveCPU("a", 5e8+15e8) // 0.75 cores
		}, want: ResidentCPU{Sandboxes: 3, Measured: 1, MeasuredP95: 0.75, Unmeasured: []RequestCount{{0.5, 1}, {1, 1}}}},
		{name: "samples of an untracked sandbox count nowhere", do: observe("x", 2),
			want: ResidentCPU{Sandboxes: 3, Measured: 1, MeasuredP95: 0.75, Unmeasured: []RequestCount{{0.5, 1}, {1, 1}}}},
		{name: "tracked with a measurement already", do: func(s *StatsSampler, _ func(time.Duration)) {
			s.Track("x", 4)
		}, want: ResidentCPU{Sandboxes: 4, Measured: 2, MeasuredP95: 2.75, Unmeasured: []RequestCount{{0.5, 1}, {1, 1}}}},
		{name: "pending ones left out", do: func(*StatsSampler, func(time.Duration)) {}, except: []string{"x", "b", "nope"},
			want: ResidentCPU{Sandboxes: 2, Measured: 1, MeasuredP95: 0.75, Unmeasured: []RequestCount{{0.5, 1}}}},
		{name: "deleted", do: func(s *StatsSampler, _ func(time.Duration)) { s.Forget("x") },
			want: ResidentCPU{Sandboxes: 3, Measured: 1, MeasuredP95: 0.75, Unmeasured: []RequestCount{{0.5, 1}, {1, 1}}}},
		{name: "a listing before b was tracked again", do: func(s *StatsSampler, _ func(time.Duration)) {
			gen = s.TrackGen()
			s.Track("b", 1) // an admission saw b run after the listing began
		}, want: ResidentCPU{Sandboxes: 3, Measured: 1, MeasuredP95: 0.75, Unmeasured: []RequestCount{{0.5, 1}, {1, 1}}}},
		{name: "pruning by that listing keeps b, drops c", do: func(s *StatsSampler, _ func(time.Duration)) {
			s.Prune(gen, func(id string) bool { return id == "a" })
		}, want: ResidentCPU{Sandboxes: 2, Measured: 1, MeasuredP95: 0.75, Unmeasured: []RequestCount{{1, 1}}}},
		{name: "history of a tracked sandbox is kept", do: func(s *StatsSampler, _ func(time.Duration)) {
			s.ForgetUntracked("a")
		}, want: ResidentCPU{Sandboxes: 2, Measured: 1, MeasuredP95: 0.75, Unmeasured: []RequestCount{{1, 1}}}},
		{name: "untracked unless tracked again since", do: func(s *StatsSampler, _ func(time.Duration)) {
			g := s.Track("b", 1)
			s.UntrackIf("b", g-1) // an older Track's look found b gone: b was tracked since
			s.UntrackIf("a", s.Track("a", 2)-1)
		}, want: ResidentCPU{Sandboxes: 2, Measured: 1, MeasuredP95: 0.75, Unmeasured: []RequestCount{{1, 1}}}},
		{name: "untracked", do: func(s *StatsSampler, _ func(time.Duration)) {
			g := s.Track("b", 1)
			s.UntrackIf("b", g)
		}, want: ResidentCPU{Sandboxes: 1, Measured: 1, MeasuredP95: 0.75}},
		{name: "a new listing prunes all", do: func(s *StatsSampler, _ func(time.Duration)) {
			s.Prune(s.TrackGen(), func(string) bool { return false })
		}, want: ResidentCPU{}},
	}
	s, err := NewStatsSampler(1, time.Minute, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	adv := func(d time.Duration) { now = now.Add(d) }
	for _, st := range steps {
		st.do(s, adv)
		got := s.ResidentCPU(st.except)
		if got.Sandboxes != st.want.Sandboxes || got.Measured != st.want.Measured ||
			math.Abs(got.MeasuredP95-st.want.MeasuredP95) > 1e-6 || !slices.Equal(got.Unmeasured, st.want.Unmeasured) {
			t.Fatalf("%s: got %+v, want %+v", st.name, got, st.want)
		}
	}
	if s.Tracked("a") || s.CPU("a").Samples == 0 {
		t.Fatal("pruning stops tracking but keeps the CPU history (Forget drops it)")
	}
	s.ForgetUntracked("a")
	if s.CPU("a").Samples != 0 {
		t.Fatal("history of an untracked sandbox kept")
	}
}

// Random tracking, samples, forgets and prunes: the kept sums equal a sum
// over the tracked sandboxes' figures, and never fall below it.
func TestStatsSamplerResidentCPUExact(t *testing.T) {
	s, err := NewStatsSampler(1, 30*time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	rng := rand.New(rand.NewPCG(1, 2))
	tracked := map[string]float64{} // id -> request
	usage := map[string]uint64{}
	requests := []float64{0.25, 0.5, 1, 2}
	for i := 0; i < 20000; i++ {
		id := fmt.Sprintf("s%d", rng.IntN(60))
		switch op := rng.IntN(10); {
		case op < 3:
			req := requests[rng.IntN(len(requests))]
			s.Track(id, req)
			tracked[id] = req
		case op < 8:
			now = now.Add(time.Duration(rng.IntN(1500)) * time.Millisecond)
			usage[id] += uint64(rng.Float64() * 3e9)
			s.ObserveCPU(id, usage[id])
		case op == 8:
			s.Forget(id)
			delete(tracked, id)
		default:
			gen := s.TrackGen()
			live := func(id string) bool { return len(id)%2 == 0 }
			s.Prune(gen, live)
			for id := range tracked {
				if !live(id) {
					delete(tracked, id)
				}
			}
		}
		var want ResidentCPU
		unmeasured := map[float64]int{}
		for id, req := range tracked {
			want.Sandboxes++
			if c := s.CPU(id); c.Samples >= 2 {
				want.Measured++
				want.MeasuredP95 += c.P95
			} else {
				unmeasured[req]++
			}
		}
		got := s.ResidentCPU(nil)
		gotUnmeasured := map[float64]int{}
		for _, r := range got.Unmeasured {
			gotUnmeasured[r.CPU] = r.Count
		}
		if got.Sandboxes != want.Sandboxes || got.Measured != want.Measured || !maps.Equal(gotUnmeasured, unmeasured) ||
			got.MeasuredP95 < want.MeasuredP95-1e-12 || got.MeasuredP95 > want.MeasuredP95+1e-6 {
			t.Fatalf("step %d: got %+v, want %+v (unmeasured %v)", i, got, want, unmeasured)
		}
	}
}
