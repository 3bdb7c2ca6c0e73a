package node

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/cgroups"
)

// StatsSampler turns cumulative cgroup CPU counters into rates and keeps a
// window of them per sandbox for p50/p95 (admission uses p95).
type StatsSampler struct {
	CgroupVersion int
	Window        int // samples kept per sandbox

	mu   sync.Mutex
	last map[string]cpuSample
	hist map[string][]float64
	now  func() time.Time
}

type cpuSample struct {
	at    time.Time
	usage uint64
}

// NewStatsSampler returns a sampler keeping window samples per sandbox.
func NewStatsSampler(cgroupVersion, window int) *StatsSampler {
	if window <= 0 {
		window = 60
	}
	return &StatsSampler{
		CgroupVersion: cgroupVersion, Window: window,
		last: map[string]cpuSample{}, hist: map[string][]float64{}, now: time.Now,
	}
}

// Observe records a cumulative CPU usage reading and returns the rate in
// cores since the previous one (0 for the first).
func (s *StatsSampler) Observe(id string, usageNanos uint64) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	prev, ok := s.last[id]
	s.last[id] = cpuSample{at: now, usage: usageNanos}
	if !ok || usageNanos < prev.usage {
		return 0
	}
	dt := now.Sub(prev.at)
	if dt < 100*time.Millisecond {
		// Too close to the last reading to be a rate; report the last one.
		if h := s.hist[id]; len(h) > 0 {
			return h[len(h)-1]
		}
		return 0
	}
	rate := float64(usageNanos-prev.usage) / float64(dt.Nanoseconds())
	h := append(s.hist[id], rate)
	if len(h) > s.Window {
		h = h[len(h)-s.Window:]
	}
	s.hist[id] = h
	return rate
}

// Percentiles returns p50 and p95 of the sandbox's recent CPU rates.
func (s *StatsSampler) Percentiles(id string) (p50, p95 float64) {
	s.mu.Lock()
	h := append([]float64(nil), s.hist[id]...)
	s.mu.Unlock()
	if len(h) == 0 {
		return 0, 0
	}
	sort.Float64s(h)
	return h[(len(h)-1)*50/100], h[(len(h)-1)*95/100]
}

// Forget drops a deleted sandbox's history.
func (s *StatsSampler) Forget(id string) {
	s.mu.Lock()
	delete(s.last, id)
	delete(s.hist, id)
	s.mu.Unlock()
}

// Fill fills out from cgroup stats.
func (s *StatsSampler) Fill(id string, cs *cgroups.Stats, out *SandboxStats) {
	out.CPUUsed = s.Observe(id, cs.CPUUsageNanos)
	out.CPUUsedP50, out.CPUUsedP95 = s.Percentiles(id)
	FillMemory(cs, out)
}

// FillMemory computes held and reclaimable memory. Held is what the
// sandbox's cgroup is charged for; reclaimable is what the kernel could
// take back without killing anything: inactive page cache always, and
// inactive anon when there is swap to put it in.
func FillMemory(cs *cgroups.Stats, out *SandboxStats) {
	out.CPUUsageSeconds = float64(cs.CPUUsageNanos) / 1e9
	out.CPUThrottledSeconds = float64(cs.CPUThrottledNanos) / 1e9
	out.MemoryLimitBytes = int64(cs.MemoryLimit)
	held := cs.Anon + cs.File + cs.Kernel
	if cs.MemoryUsage > held {
		held = cs.MemoryUsage
	}
	out.MemoryHeldBytes = int64(held)
	reclaimable := cs.InactiveFile
	if SwapTotal() > 0 {
		reclaimable += cs.InactiveAnon
	}
	out.MemoryReclaimableBytes = int64(reclaimable)
	out.MemoryAnonBytes = int64(cs.Anon)
	out.MemoryFileBytes = int64(cs.File)
	out.MemoryShmemBytes = int64(cs.Shmem)
	out.MemoryKernelBytes = int64(cs.Kernel)
	out.MemorySwappedBytes = int64(cs.Swap)
	out.PidsCurrent = int64(cs.PidsCurrent)
	out.OOMKills = int64(cs.OOMKills)
	if cs.HasPSI {
		out.MemoryPressureAvg10 = cs.MemoryPressure.Some.Avg10
		out.CPUPressureAvg10 = cs.CPUPressure.Some.Avg10
	}
}

// ReadMeminfo parses /proc/meminfo into bytes.
func ReadMeminfo() (map[string]int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseInt(string(f[1]), 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 2 && string(f[2]) == "kB" {
			v *= 1024
		}
		out[string(bytes.TrimSuffix(f[0], []byte(":")))] = v
	}
	return out, sc.Err()
}

// SwapTotal returns the host's swap size in bytes.
func SwapTotal() int64 {
	mi, err := ReadMeminfo()
	if err != nil {
		return 0
	}
	return mi["SwapTotal"]
}

func numCPU() int { return goruntime.NumCPU() }

// SchedCoreSupported reports whether the kernel has core scheduling
// (CONFIG_SCHED_CORE): PR_SCHED_CORE_GET on ourselves fails with EINVAL
// when it is missing.
func SchedCoreSupported() bool {
	var cookie uint64
	const prSchedCore, prSchedCoreGet = 62, 0
	err := unix.Prctl(prSchedCore, prSchedCoreGet, 0, 0 /* PIDTYPE_PID */, uintptrOf(&cookie))
	return err == nil
}

// DiskUsage sums the allocated bytes below dir (the sandbox's private layer).
func DiskUsage(dir string) int64 {
	var total int64
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil {
			total += st.Blocks * 512
		}
		return nil
	})
	return total
}
