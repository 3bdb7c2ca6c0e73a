package runtime_test

import (
	"context"
	"fmt"
	"sort"
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
