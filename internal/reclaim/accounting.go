package reclaim

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Memory is one sandbox's (or the node's) memory, in bytes.
type Memory struct {
	// Held is what the group is charged for right now (memory.current /
	// memory.usage_in_bytes), never less than Anon+File+Kernel.
	Held int64 `json:"held"`
	// Anon, File (page cache incl. Shmem), Shmem, Kernel break Held down.
	Anon   int64 `json:"anon"`
	File   int64 `json:"file"`
	Shmem  int64 `json:"shmem"`
	Kernel int64 `json:"kernel"`
	// Reclaimable is the cold part of Held: inactive page cache, plus
	// inactive anon when there is swap to put it in. This is what
	// proactive reclaim goes after.
	Reclaimable int64 `json:"reclaimable"`
	// Reusable is what the host could take back now without writing
	// anything: page cache that is not shmem (clean cache is dropped, not
	// written). Dirty pages make this an upper bound.
	Reusable int64 `json:"reusable"`
	// Swapped is the group's memory out in swap (zram or disk); Compressed
	// is what its zswap pool entries occupy (v2 only).
	Swapped    int64 `json:"swapped"`
	Compressed int64 `json:"compressed"`
}

// MemoryOf turns cgroup stats into Memory. swapAvailable says whether the
// node has free swap, which decides whether cold anon counts as
// reclaimable.
func MemoryOf(s *cgroups.Stats, swapAvailable bool) Memory {
	m := Memory{
		Anon:       int64(s.Anon),
		File:       int64(s.File),
		Shmem:      int64(s.Shmem),
		Kernel:     int64(s.Kernel),
		Swapped:    int64(s.Swap),
		Compressed: int64(s.Zswap),
	}
	m.Held = int64(s.MemoryUsage)
	if parts := m.Anon + m.File + m.Kernel; parts > m.Held {
		m.Held = parts
	}
	m.Reclaimable = int64(s.InactiveFile)
	if swapAvailable {
		m.Reclaimable += int64(s.InactiveAnon)
	}
	if m.Reusable = m.File - m.Shmem; m.Reusable < 0 {
		m.Reusable = 0
	}
	return m
}

// Node is the node-wide memory picture from /proc/meminfo.
type Node struct {
	Total     int64 `json:"total"`
	Available int64 `json:"available"` // MemAvailable: reusable now
	// Held is Total-Available: what the host could not hand out now.
	Held          int64 `json:"held"`
	InactiveFile  int64 `json:"inactive_file"`
	InactiveAnon  int64 `json:"inactive_anon"`
	SwapTotal     int64 `json:"swap_total"`
	SwapFree      int64 `json:"swap_free"`
	Zswap         int64 `json:"zswap"`    // compressed size in the zswap pool
	Zswapped      int64 `json:"zswapped"` // what it holds, uncompressed
	Shmem         int64 `json:"shmem"`
	Reclaimable   int64 `json:"reclaimable"` // inactive file + (inactive anon if swap free)
	SwapAvailable bool  `json:"swap_available"`
}

// ReadNode parses a meminfo file (normally /proc/meminfo).
func ReadNode(meminfo string) (Node, error) {
	b, err := os.ReadFile(meminfo)
	if err != nil {
		return Node{}, fmt.Errorf("reclaim: read %s: %w", meminfo, err)
	}
	return ParseMeminfo(meminfo, b)
}

// ParseMeminfo parses /proc/meminfo content.
func ParseMeminfo(name string, b []byte) (Node, error) {
	kv := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if strings.TrimSpace(text) == "" {
			continue
		}
		k, rest, ok := strings.Cut(text, ":")
		fields := strings.Fields(rest)
		if !ok || len(fields) == 0 || len(fields) > 2 || (len(fields) == 2 && fields[1] != "kB") {
			return Node{}, fmt.Errorf("reclaim: malformed %s line %d %q: %w", name, line, text, errdefs.ErrInvalidArgument)
		}
		v, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return Node{}, fmt.Errorf("reclaim: malformed %s line %d %q: %w", name, line, text, errdefs.ErrInvalidArgument)
		}
		if len(fields) == 2 {
			v *= 1024
		}
		kv[k] = v
	}
	for _, k := range []string{"MemTotal", "MemAvailable"} {
		if _, ok := kv[k]; !ok {
			return Node{}, fmt.Errorf("reclaim: %s has no %s: %w", name, k, errdefs.ErrInvalidArgument)
		}
	}
	n := Node{
		Total: kv["MemTotal"], Available: kv["MemAvailable"],
		InactiveFile: kv["Inactive(file)"], InactiveAnon: kv["Inactive(anon)"],
		SwapTotal: kv["SwapTotal"], SwapFree: kv["SwapFree"],
		Zswap: kv["Zswap"], Zswapped: kv["Zswapped"], Shmem: kv["Shmem"],
	}
	n.Held = n.Total - n.Available
	n.SwapAvailable = n.SwapFree > 0
	n.Reclaimable = n.InactiveFile
	if n.SwapAvailable {
		n.Reclaimable += n.InactiveAnon
	}
	return n, nil
}

// CPU is a sandbox's CPU use in cores.
type CPU struct {
	Rate    float64 `json:"rate"` // over the last interval
	P50     float64 `json:"p50"`  // of interval rates within the window
	P95     float64 `json:"p95"`
	Samples int     `json:"samples"`
}

// CPUSampler keeps, per sandbox, the cumulative CPU counter readings of a
// time window and derives rates from them. Feed it from the stats loop; it
// does no I/O. Safe for concurrent use.
type CPUSampler struct {
	window time.Duration
	// minInterval keeps two readings taken back to back (an API stats
	// call right after the loop's) from producing a noisy rate.
	minInterval time.Duration

	mu sync.Mutex
	s  map[string]*series
}

type reading struct {
	at    time.Time
	usage uint64
}

type series struct {
	readings []reading // oldest first, within window
	// cpu is computed when a reading is added: admission asks for every
	// sandbox's figures on each create, far more often than readings come.
	cpu CPU
}

// NewCPUSampler keeps readings for window (e.g. 5m); readings closer than
// minInterval to the previous one are ignored.
func NewCPUSampler(window, minInterval time.Duration) (*CPUSampler, error) {
	if window <= 0 || minInterval < 0 || minInterval >= window {
		return nil, fmt.Errorf("reclaim: sampler window %v / min interval %v: %w", window, minInterval, errdefs.ErrInvalidArgument)
	}
	return &CPUSampler{window: window, minInterval: minInterval, s: map[string]*series{}}, nil
}

// Observe records a cumulative usage reading (cgroups.Stats.CPUUsageNanos)
// taken at at. A counter that went backwards (the group was recreated)
// restarts the series.
func (c *CPUSampler) Observe(id string, at time.Time, usageNanos uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.s[id]
	if s == nil {
		s = &series{}
		c.s[id] = s
	}
	if n := len(s.readings); n > 0 {
		last := s.readings[n-1]
		switch {
		case usageNanos < last.usage:
			s.readings = s.readings[:0]
		case !at.After(last.at), at.Sub(last.at) < c.minInterval:
			return
		}
	}
	s.readings = append(s.readings, reading{at, usageNanos})
	// Keep one reading older than the window so the window is fully
	// covered by intervals.
	cut := 0
	for cut+1 < len(s.readings) && at.Sub(s.readings[cut+1].at) >= c.window {
		cut++
	}
	if cut > 0 {
		s.readings = append(s.readings[:0], s.readings[cut:]...)
	}
	s.cpu = figures(s.readings)
}

// figures computes the rates of readings (oldest first).
func figures(rs []reading) CPU {
	if len(rs) < 2 {
		return CPU{Samples: len(rs)}
	}
	rates := make([]float64, 0, len(rs)-1)
	for i := 1; i < len(rs); i++ {
		rates = append(rates, rate(rs[i-1], rs[i]))
	}
	out := CPU{Rate: rates[len(rates)-1], Samples: len(rs)}
	sort.Float64s(rates)
	out.P50, out.P95 = percentile(rates, 0.50), percentile(rates, 0.95)
	return out
}

// CPU returns the sandbox's rates. Zero CPU if fewer than two readings.
func (c *CPUSampler) CPU(id string) CPU {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.s[id]; s != nil {
		return s.cpu
	}
	return CPU{}
}

// Forget drops a deleted sandbox.
func (c *CPUSampler) Forget(id string) {
	c.mu.Lock()
	delete(c.s, id)
	c.mu.Unlock()
}

// SumP95 is the sum of every sandbox's p95 rate: the measured CPU demand
// admission compares against capacity.
func (c *CPUSampler) SumP95() float64 {
	c.mu.Lock()
	ids := make([]string, 0, len(c.s))
	for id := range c.s {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	var sum float64
	for _, id := range ids {
		sum += c.CPU(id).P95
	}
	return sum
}

func rate(a, b reading) float64 {
	return float64(b.usage-a.usage) / float64(b.at.Sub(a.at).Nanoseconds())
}

// percentile uses the nearest-rank method on sorted values.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p * float64(len(sorted))))
	if rank < 1 {
		rank = 1
	}
	if rank > len(sorted) {
		rank = len(sorted)
	}
	return sorted[rank-1]
}
