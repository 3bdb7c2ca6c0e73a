package node

import (
	"cmp"
	"fmt"
	"math"
	goruntime "runtime"
	"slices"
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

	// res is the CPU of the tracked sandboxes, kept as they change, so
	// that admission reads a sum instead of walking every sandbox.
	resMu sync.Mutex
	res   residentCPU
}

// residentCPU sums the CPU of the sandboxes tracked as running or paused:
// the measured p95 of those with at least two samples, the requests of
// the others. a StatsSampler's resMu held.
type residentCPU struct {
	entries map[string]*residentEntry
	gen     uint64 // counts Track calls; see Prune
	// p95Nanos sums the measured p95s in nanocores, each rounded up: an
	// integer sum stays exact through any number of additions and
	// removals (a float one drifts), and rounding up never undercounts.
	p95Nanos int64
	measured int
	// unmeasured counts the unmeasured sandboxes per requested CPU: a
	// newcomer's expected use is a function of the request (min(request,
	// average)), so admission needs the requests, and they take few
	// distinct values.
	unmeasured map[float64]int
}

type residentEntry struct {
	request  float64
	p95Nanos int64
	measured bool
	gen      uint64 // the Track call that last set it
}

// RequestCount is how many tracked sandboxes without a measured rate
// requested CPU cores.
type RequestCount struct {
	CPU   float64
	Count int
}

// ResidentCPU is the CPU of the tracked sandboxes, as admission sums it.
type ResidentCPU struct {
	Sandboxes   int
	Measured    int     // sandboxes with a measured p95 (>= 2 samples)
	MeasuredP95 float64 // their p95s' sum (cores)
	// Unmeasured are the requests of the others, by request (ascending).
	Unmeasured []RequestCount
}

func nanocores(c float64) int64 { return int64(math.Ceil(c * 1e9)) }

// add counts e in the sums; sub takes it out again.
func (r *residentCPU) add(e *residentEntry) {
	if e.measured {
		r.p95Nanos += e.p95Nanos
		r.measured++
		return
	}
	r.unmeasured[e.request]++
}

// drop stops tracking id.
func (r *residentCPU) drop(id string, e *residentEntry) {
	r.sub(e)
	delete(r.entries, id)
}

func (r *residentCPU) sub(e *residentEntry) {
	if e.measured {
		r.p95Nanos -= e.p95Nanos
		r.measured--
		return
	}
	if r.unmeasured[e.request]--; r.unmeasured[e.request] <= 0 {
		delete(r.unmeasured, e.request)
	}
}

// set makes e's contribution the one of c. s.resMu held.
func (r *residentCPU) set(e *residentEntry, c reclaim.CPU) {
	r.sub(e)
	e.measured = c.Samples >= 2
	e.p95Nanos = 0
	if e.measured {
		e.p95Nanos = nanocores(c.P95)
	}
	r.add(e)
}

// Track counts a running or paused sandbox that requested cpu cores in
// ResidentCPU from now on, with its measured p95 once it has one. Tracking
// a tracked sandbox again only marks it as seen now (see Prune). It
// returns the entry's generation for UntrackIf: the caller looks the
// sandbox up again after tracking it, since a delete may have forgotten
// it in between.
func (s *StatsSampler) Track(id string, cpu float64) uint64 {
	s.resMu.Lock()
	defer s.resMu.Unlock()
	r := &s.res
	if r.entries == nil {
		r.entries, r.unmeasured = map[string]*residentEntry{}, map[float64]int{}
	}
	r.gen++
	e := r.entries[id]
	if e == nil {
		e = &residentEntry{request: cpu}
		r.entries[id] = e
		r.add(e)
	} else if e.request != cpu {
		r.sub(e)
		e.request = cpu
		r.add(e)
	}
	e.gen = r.gen
	r.set(e, s.cpu.CPU(id))
	return e.gen
}

// UntrackIf stops tracking the sandbox if nothing tracked it since the
// Track that returned gen.
func (s *StatsSampler) UntrackIf(id string, gen uint64) {
	s.resMu.Lock()
	defer s.resMu.Unlock()
	if e := s.res.entries[id]; e != nil && e.gen == gen {
		s.res.drop(id, e)
	}
}

// TrackGen returns the current Track count. A listing of the sandboxes
// taken after it was read shows every sandbox tracked before it in its
// state then (or a later one): see Prune.
func (s *StatsSampler) TrackGen() uint64 {
	s.resMu.Lock()
	defer s.resMu.Unlock()
	return s.res.gen
}

// Prune stops tracking the sandboxes that a listing of the node, taken
// after TrackGen returned gen, showed not running or paused (live false:
// dead, deleted, or gone). A sandbox tracked after TrackGen returned is
// kept: it was seen running after the listing began (an admission saw
// its create finish), and dropping it would undercount it until the next
// listing. Pruning also drops what Track was told by a listing older than
// a sandbox's delete (which forgot it).
func (s *StatsSampler) Prune(gen uint64, live func(id string) bool) {
	s.resMu.Lock()
	defer s.resMu.Unlock()
	r := &s.res
	for id, e := range r.entries {
		if e.gen <= gen && !live(id) {
			r.drop(id, e)
		}
	}
}

// ForgetUntracked drops the history of a sandbox that is not tracked: a
// listing showed it not running, and no admission saw it run since.
func (s *StatsSampler) ForgetUntracked(id string) {
	s.resMu.Lock()
	defer s.resMu.Unlock()
	if s.res.entries[id] == nil {
		s.cpu.Forget(id)
	}
}

// Tracked reports whether the sandbox is tracked.
func (s *StatsSampler) Tracked(id string) bool {
	s.resMu.Lock()
	defer s.resMu.Unlock()
	return s.res.entries[id] != nil
}

// ResidentCPU returns the tracked sandboxes' CPU, leaving out those named
// in except (admission counts those as pending). It costs O(len(except)
// + distinct requests), not O(sandboxes).
func (s *StatsSampler) ResidentCPU(except []string) ResidentCPU {
	s.resMu.Lock()
	defer s.resMu.Unlock()
	r := &s.res
	p95, measured, sandboxes := r.p95Nanos, r.measured, len(r.entries)
	var skip map[float64]int // unmeasured left out, by request
	for _, id := range except {
		e := r.entries[id]
		if e == nil {
			continue
		}
		sandboxes--
		if e.measured {
			p95 -= e.p95Nanos
			measured--
			continue
		}
		if skip == nil {
			skip = map[float64]int{}
		}
		skip[e.request]++
	}
	out := ResidentCPU{Sandboxes: sandboxes, Measured: measured, MeasuredP95: float64(p95) / 1e9}
	for req, n := range r.unmeasured {
		if n -= skip[req]; n > 0 {
			out.Unmeasured = append(out.Unmeasured, RequestCount{CPU: req, Count: n})
		}
	}
	slices.SortFunc(out.Unmeasured, func(a, b RequestCount) int { return cmp.Compare(a.CPU, b.CPU) })
	return out
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

// ObserveCPU records a cumulative CPU time reading (nanoseconds) and, for
// a tracked sandbox, its new p95 in ResidentCPU.
func (s *StatsSampler) ObserveCPU(id string, usageNanos uint64) {
	s.cpu.Observe(id, s.now(), usageNanos)
	s.resMu.Lock()
	defer s.resMu.Unlock()
	// The figures are read under resMu: of concurrent observers, the last
	// to take it sets what every reading before it made.
	if e := s.res.entries[id]; e != nil {
		s.res.set(e, s.cpu.CPU(id))
	}
}

// CPU returns the sandbox's measured CPU (Samples < 2: not measured yet).
func (s *StatsSampler) CPU(id string) reclaim.CPU { return s.cpu.CPU(id) }

// Forget drops a deleted sandbox's history and stops tracking it.
func (s *StatsSampler) Forget(id string) {
	s.cpu.Forget(id)
	s.resMu.Lock()
	defer s.resMu.Unlock()
	if e := s.res.entries[id]; e != nil {
		s.res.drop(id, e)
	}
}

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
