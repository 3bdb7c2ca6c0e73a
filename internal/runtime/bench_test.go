package runtime_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/runtime"
)

func reportLatency(b *testing.B, name string, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, name+"-p50-ms")
	b.ReportMetric(float64(d[len(d)*99/100].Microseconds())/1000, name+"-p99-ms")
}

// BenchmarkCreateDestroy measures a full create followed by destroy.
func BenchmarkCreateDestroy(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	var creates, destroys []time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("bcd%d", i)
		t0 := time.Now()
		if _, err := e.rt.Create(ctx, e.spec(id)); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := e.rt.Destroy(ctx, id); err != nil {
			b.Fatal(err)
		}
		creates = append(creates, t1.Sub(t0))
		destroys = append(destroys, time.Since(t1))
	}
	reportLatency(b, "create", creates)
	reportLatency(b, "destroy", destroys)
}

// BenchmarkCreateParallel2 creates with 2 workers, then destroys with 2,
// reporting the rates.
func BenchmarkCreateParallel2(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	var n atomic.Int64
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = fmt.Sprintf("bcp%d", i)
	}
	run := func(fn func(id string) error) time.Duration {
		n.Store(0)
		var wg sync.WaitGroup
		t0 := time.Now()
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := n.Add(1) - 1
					if i >= int64(len(ids)) {
						return
					}
					if err := fn(ids[i]); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		return time.Since(t0)
	}
	b.ResetTimer()
	tc := run(func(id string) error { _, err := e.rt.Create(ctx, e.spec(id)); return err })
	td := run(func(id string) error { return e.rt.Destroy(ctx, id) })
	b.ReportMetric(float64(b.N)/tc.Seconds(), "creates/s")
	b.ReportMetric(float64(b.N)/td.Seconds(), "destroys/s")
}

// BenchmarkExecTrue measures exec of /bin/true (start to result).
func BenchmarkExecTrue(b *testing.B) {
	e := newEnv(b)
	e.create("bexec")
	ctx := context.Background()
	var lat []time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		res, err := runtime.Run(ctx, e.rt, "bexec", runtime.Process{Args: []string{"/bin/true"}}, runtime.IO{})
		if err != nil || res.ExitCode != 0 {
			b.Fatal(err, res)
		}
		lat = append(lat, time.Since(t0))
	}
	reportLatency(b, "exec", lat)
}

// BenchmarkIdleFootprint creates b.N idle sandboxes and reports the
// average PSS and private memory of their inits and the drop of
// MemAvailable per sandbox (kernel objects included).
func BenchmarkIdleFootprint(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	avail := func() int64 {
		v, _ := strconv.ParseInt(strings.Fields(procFieldB(b, "/proc/meminfo", "MemAvailable"))[0], 10, 64)
		return v
	}
	kernel := func() int64 {
		var sum int64
		for _, k := range []string{"Slab", "Percpu", "KernelStack", "PageTables", "VmallocUsed"} {
			v, _ := strconv.ParseInt(strings.Fields(procFieldB(b, "/proc/meminfo", k))[0], 10, 64)
			sum += v
		}
		return sum
	}
	a0, k0 := avail(), kernel()
	var pids []int
	for i := 0; i < b.N; i++ {
		st, err := e.rt.Create(ctx, e.spec(fmt.Sprintf("idle%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		pids = append(pids, st.Pid)
	}
	time.Sleep(time.Second)
	a1, k1 := avail(), kernel()
	var pss, priv int64
	for _, pid := range pids {
		f := "/proc/" + strconv.Itoa(pid) + "/smaps_rollup"
		p, _ := strconv.ParseInt(strings.Fields(procFieldB(b, f, "Pss"))[0], 10, 64)
		d, _ := strconv.ParseInt(strings.Fields(procFieldB(b, f, "Private_Dirty"))[0], 10, 64)
		c, _ := strconv.ParseInt(strings.Fields(procFieldB(b, f, "Private_Clean"))[0], 10, 64)
		pss += p
		priv += d + c
	}
	n := int64(len(pids))
	// Everything charged to the sandboxes' cgroups (user and kernel memory
	// of what ran after the init joined its group).
	if g, err := e.cg.Load(ctx, e.parent); err == nil {
		if st, err := g.Stats(); err == nil {
			b.ReportMetric(float64(st.MemoryUsage)/1024/float64(n), "cgroup-charged-kB/sandbox")
		}
	}
	b.ReportMetric(float64(pss)/float64(n), "init-pss-kB")
	b.ReportMetric(float64(priv)/float64(n), "init-private-kB")
	b.ReportMetric(float64(a0-a1)/float64(n), "memavail-drop-kB/sandbox")
	b.ReportMetric(float64(k1-k0)/float64(n), "kernel-kB/sandbox")
	for i := range pids {
		if err := e.rt.Destroy(ctx, fmt.Sprintf("idle%d", i)); err != nil {
			b.Fatal(err)
		}
	}
}

func procFieldB(b testing.TB, path, key string) string {
	raw, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	b.Fatalf("%s: no %s", path, key)
	return ""
}
