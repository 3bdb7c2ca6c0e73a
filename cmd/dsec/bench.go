package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/client"
)

// benchLabel marks sandboxes a bench run created, so cleanup also finds
// ones whose create reply never arrived (interrupted mid-request).
const benchLabel = "dsec.bench"

type benchOpts struct {
	n, parallel int
	image       string
	asJSON      bool
	keep        bool
	settle      time.Duration
	shape       client.SandboxSpec
}

// benchResult is the --json output. Optional figures are pointers so they
// appear only for the benchmarks that measure them.
type benchResult struct {
	Kind        string  `json:"kind"`
	N           int     `json:"n"`
	Parallel    int     `json:"parallel"`
	OK          int     `json:"ok"`
	Errors      int     `json:"errors"`
	P50Ms       float64 `json:"p50_ms"`
	P90Ms       float64 `json:"p90_ms"`
	P99Ms       float64 `json:"p99_ms"`
	MaxMs       float64 `json:"max_ms"`
	MeanMs      float64 `json:"mean_ms"`
	PerSec      float64 `json:"per_sec"`
	WallSeconds float64 `json:"wall_seconds"`

	TeardownPerSec *float64 `json:"teardown_per_sec,omitempty"`
	TeardownP50Ms  *float64 `json:"teardown_p50_ms,omitempty"`
	TeardownP99Ms  *float64 `json:"teardown_p99_ms,omitempty"`

	HostBytesPerSandbox *int64   `json:"host_bytes_per_sandbox,omitempty"`
	CreatePerSecAtEnd   *float64 `json:"create_per_sec_at_end,omitempty"`
	MemAvailableBefore  *int64   `json:"mem_available_before,omitempty"`
	MemAvailableAfter   *int64   `json:"mem_available_after,omitempty"`
	SettleSeconds       *float64 `json:"settle_seconds,omitempty"`

	FirstError string `json:"first_error,omitempty"`
}

func newBenchCmd(a *app) *cobra.Command {
	cmd := group("bench", "Measure create, exec and density on a live server")
	cmd.AddCommand(
		benchSub(a, "create", "Create N sandboxes (P at a time), then delete them; latency and rates", benchCreate),
		benchSub(a, "exec", "Run N execs of /bin/true in one sandbox (P at a time); latency", benchExec),
		benchSub(a, "density", "Create N sandboxes and keep them; host memory per sandbox and create rate at the end", benchDensity),
	)
	return cmd
}

type benchFunc func(ctx context.Context, c *client.Client, o *benchOpts, tr *tracker) (*benchResult, error)

func benchSub(a *app, name, short string, fn benchFunc) *cobra.Command {
	o := &benchOpts{n: 10, parallel: 4, settle: 5 * time.Second}
	cmd := &cobra.Command{
		Use:   name,
		Short: short,
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.n < 1 || o.parallel < 1 {
				return usagef("--n and --parallel must be at least 1")
			}
			if o.image == "" {
				return usagef("--image is required")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			tr := newTracker(c, benchRunID())
			res, err := fn(ctx, c, o, tr)
			// Clean up whatever happened (also after Ctrl-C, whose
			// context is cancelled: cleanup gets its own).
			if !o.keep {
				if cerr := tr.cleanup(ctx, o.parallel); cerr != nil {
					fmt.Fprintf(a.stderr, "dsec: bench cleanup: %s\n", oneLine(cerr.Error()))
				}
			} else if n := tr.count(); n > 0 {
				fmt.Fprintf(a.stderr, "dsec: kept %d sandboxes (label %s=%s)\n", n, benchLabel, tr.run)
			}
			if err != nil {
				return err
			}
			if ctx.Err() != nil {
				return fmt.Errorf("bench %s interrupted", name)
			}
			if o.asJSON {
				return printJSON(a.stdout, res)
			}
			printBench(a.stdout, res)
			if res.FirstError != "" {
				fmt.Fprintf(a.stderr, "dsec: %d of %d operations failed; first error: %s\n", res.Errors, res.N, res.FirstError)
			}
			if res.OK == 0 {
				return fmt.Errorf("bench %s: every operation failed", name)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVarP(&o.n, "n", "n", o.n, "operations (sandboxes, or execs)")
	f.IntVarP(&o.parallel, "parallel", "p", o.parallel, "operations in flight at once")
	f.StringVar(&o.image, "image", "", "image NAME[:TAG] (required)")
	f.BoolVar(&o.asJSON, "json", false, "print one JSON object")
	f.BoolVar(&o.keep, "keep", false, "keep the sandboxes instead of deleting them")
	addShapeFlags(cmd, &o.shape)
	if name == "density" {
		f.Var(durationValue{&o.settle}, "settle", "wait this long after the last create before reading memory")
	}
	return cmd
}

func benchRunID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (o *benchOpts) spec(run string) client.SandboxSpec {
	s := o.shape
	s.Image = o.image
	s.Labels = map[string]string{benchLabel: run}
	return s
}

// tracker remembers every sandbox a run created, for cleanup.
type tracker struct {
	c   *client.Client
	run string
	mu  sync.Mutex
	ids map[string]bool
}

func newTracker(c *client.Client, run string) *tracker {
	return &tracker{c: c, run: run, ids: map[string]bool{}}
}

func (t *tracker) add(id string) {
	t.mu.Lock()
	t.ids[id] = true
	t.mu.Unlock()
}

func (t *tracker) forget(id string) {
	t.mu.Lock()
	delete(t.ids, id)
	t.mu.Unlock()
}

func (t *tracker) list() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.ids))
	for id := range t.ids {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

func (t *tracker) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.ids)
}

// cleanup deletes the run's sandboxes: those it knows, then any the server
// lists under the run's label.
func (t *tracker) cleanup(parent context.Context, parallel int) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), 2*time.Minute)
	defer cancel()
	ids := t.list()
	if listed, err := t.c.ListSandboxes(ctx, map[string]string{benchLabel: t.run}, ""); err == nil {
		for _, sb := range listed {
			if !t.ids[sb.ID] {
				ids = append(ids, sb.ID)
			}
		}
	}
	var firstErr atomic.Value
	runParallel(ctx, len(ids), parallel, func(ctx context.Context, i int) error {
		err := t.c.DeleteSandbox(ctx, ids[i])
		if err != nil && !client.IsNotFound(err) {
			firstErr.CompareAndSwap(nil, err)
			return err
		}
		t.forget(ids[i])
		return nil
	})
	if e, ok := firstErr.Load().(error); ok {
		return e
	}
	return nil
}

// op is one timed operation.
type op struct {
	lat  time.Duration
	end  time.Time
	err  error
	done bool
}

// opTimeout bounds one operation once the run has been interrupted.
const opTimeout = 5 * time.Minute

// runParallel runs fn for i in [0,n) with at most p in flight and returns
// each operation's timing. When ctx ends it starts nothing new but lets
// operations in flight finish: a create cancelled mid-request may still
// complete on the server after the client gave up, and would then escape
// cleanup.
func runParallel(ctx context.Context, n, p int, fn func(ctx context.Context, i int) error) []op {
	ops := make([]op, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	opBase := context.WithoutCancel(ctx)
	for range min(p, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				octx, cancel := context.WithTimeout(opBase, opTimeout)
				start := time.Now()
				err := fn(octx, i)
				cancel()
				end := time.Now()
				ops[i] = op{lat: end.Sub(start), end: end, err: err, done: true}
			}
		}()
	}
	wg.Wait()
	return ops
}

// summarize fills the latency figures of ops that succeeded.
func summarize(kind string, o *benchOpts, ops []op, wall time.Duration) *benchResult {
	r := &benchResult{Kind: kind, N: o.n, Parallel: o.parallel, WallSeconds: wall.Seconds()}
	var lats []time.Duration
	for _, x := range ops {
		switch {
		case !x.done:
			r.Errors++ // never ran: interrupted
		case x.err != nil:
			r.Errors++
			if r.FirstError == "" {
				r.FirstError = oneLine(x.err.Error())
			}
		default:
			lats = append(lats, x.lat)
		}
	}
	r.OK = len(lats)
	r.P50Ms, r.P90Ms, r.P99Ms, r.MaxMs, r.MeanMs = latencies(lats)
	if wall > 0 {
		r.PerSec = round2(float64(r.OK) / wall.Seconds())
	}
	return r
}

// latencies returns nearest-rank percentiles in milliseconds.
func latencies(lats []time.Duration) (p50, p90, p99, maxMs, mean float64) {
	if len(lats) == 0 {
		return
	}
	s := append([]time.Duration(nil), lats...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	ms := func(d time.Duration) float64 { return round2(float64(d) / float64(time.Millisecond)) }
	rank := func(p float64) time.Duration {
		i := int(math.Ceil(p/100*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return ms(rank(50)), ms(rank(90)), ms(rank(99)), ms(s[len(s)-1]), ms(sum / time.Duration(len(s)))
}

func round2(v float64) float64 { return math.Round(v*100) / 100 }

// rateAtEnd is the completion rate over the last 10% of successful
// operations: k completions in the window that starts at the completion
// just before them (or at start when there is none).
func rateAtEnd(ops []op, start time.Time) float64 {
	var ends []time.Time
	for _, x := range ops {
		if x.done && x.err == nil {
			ends = append(ends, x.end)
		}
	}
	if len(ends) == 0 {
		return 0
	}
	sort.Slice(ends, func(i, j int) bool { return ends[i].Before(ends[j]) })
	k := max(1, int(math.Ceil(float64(len(ends))/10)))
	from := start
	if len(ends)-k-1 >= 0 {
		from = ends[len(ends)-k-1]
	}
	span := ends[len(ends)-1].Sub(from).Seconds()
	if span <= 0 {
		return 0
	}
	return round2(float64(k) / span)
}

func benchCreate(ctx context.Context, c *client.Client, o *benchOpts, tr *tracker) (*benchResult, error) {
	spec := o.spec(tr.run)
	ids := make([]string, o.n)
	start := time.Now()
	ops := runParallel(ctx, o.n, o.parallel, func(ctx context.Context, i int) error {
		sb, err := c.CreateSandbox(ctx, spec)
		if err != nil {
			return err
		}
		tr.add(sb.ID)
		ids[i] = sb.ID
		return nil
	})
	res := summarize("create", o, ops, time.Since(start))
	if o.keep || ctx.Err() != nil {
		return res, nil
	}
	var live []string
	for _, id := range ids {
		if id != "" {
			live = append(live, id)
		}
	}
	tstart := time.Now()
	tops := runParallel(ctx, len(live), o.parallel, func(ctx context.Context, i int) error {
		if err := c.DeleteSandbox(ctx, live[i]); err != nil {
			return err
		}
		tr.forget(live[i])
		return nil
	})
	twall := time.Since(tstart)
	var tl []time.Duration
	for _, x := range tops {
		if x.done && x.err == nil {
			tl = append(tl, x.lat)
		} else if x.err != nil {
			res.Errors++
			if res.FirstError == "" {
				res.FirstError = oneLine(x.err.Error())
			}
		}
	}
	p50, _, p99, _, _ := latencies(tl)
	rate := 0.0
	if twall > 0 {
		rate = round2(float64(len(tl)) / twall.Seconds())
	}
	res.TeardownP50Ms, res.TeardownP99Ms, res.TeardownPerSec = &p50, &p99, &rate
	return res, nil
}

func benchExec(ctx context.Context, c *client.Client, o *benchOpts, tr *tracker) (*benchResult, error) {
	sb, err := c.CreateSandbox(ctx, o.spec(tr.run))
	if err != nil {
		return nil, fmt.Errorf("create bench sandbox: %w", err)
	}
	tr.add(sb.ID)
	req := client.ExecRequest{SandboxID: sb.ID, Args: []string{"/bin/true"}}
	start := time.Now()
	ops := runParallel(ctx, o.n, o.parallel, func(ctx context.Context, i int) error {
		res, err := c.Exec(ctx, req, nil, io.Discard, io.Discard)
		if err != nil {
			return err
		}
		if res.ExitCode != 0 || res.Signal != "" {
			return fmt.Errorf("/bin/true exited %d (signal %q)", res.ExitCode, res.Signal)
		}
		return nil
	})
	return summarize("exec", o, ops, time.Since(start)), nil
}

// memAvailable sums MemAvailable over the nodes.
func memAvailable(ctx context.Context, c *client.Client) (int64, error) {
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return 0, err
	}
	if len(nodes) == 0 {
		return 0, errors.New("server reports no nodes")
	}
	var sum int64
	for _, n := range nodes {
		sum += n.MemAvailable
	}
	return sum, nil
}

func benchDensity(ctx context.Context, c *client.Client, o *benchOpts, tr *tracker) (*benchResult, error) {
	before, err := memAvailable(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("read node memory: %w", err)
	}
	spec := o.spec(tr.run)
	start := time.Now()
	ops := runParallel(ctx, o.n, o.parallel, func(ctx context.Context, i int) error {
		sb, err := c.CreateSandbox(ctx, spec)
		if err != nil {
			return err
		}
		tr.add(sb.ID)
		return nil
	})
	res := summarize("density", o, ops, time.Since(start))
	atEnd := rateAtEnd(ops, start)
	res.CreatePerSecAtEnd = &atEnd
	if ctx.Err() != nil {
		return res, nil
	}
	// Let page cache, lazy fetches and reclaim settle before measuring.
	select {
	case <-time.After(o.settle):
	case <-ctx.Done():
		return res, nil
	}
	after, err := memAvailable(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("read node memory: %w", err)
	}
	settle := o.settle.Seconds()
	res.MemAvailableBefore, res.MemAvailableAfter, res.SettleSeconds = &before, &after, &settle
	if res.OK > 0 {
		per := (before - after) / int64(res.OK)
		res.HostBytesPerSandbox = &per
	}
	return res, nil
}

func printBench(w io.Writer, r *benchResult) {
	fmt.Fprintf(w, "bench %s: n=%d parallel=%d ok=%d errors=%d wall=%.2fs\n", r.Kind, r.N, r.Parallel, r.OK, r.Errors, r.WallSeconds)
	t := newTable(w)
	t.row("  latency", fmt.Sprintf("p50 %.2fms", r.P50Ms), fmt.Sprintf("p90 %.2fms", r.P90Ms), fmt.Sprintf("p99 %.2fms", r.P99Ms), fmt.Sprintf("max %.2fms", r.MaxMs))
	t.row("  rate", fmt.Sprintf("%.2f/s", r.PerSec))
	if r.TeardownPerSec != nil {
		t.row("  teardown", fmt.Sprintf("p50 %.2fms", *r.TeardownP50Ms), fmt.Sprintf("p99 %.2fms", *r.TeardownP99Ms), fmt.Sprintf("%.2f/s", *r.TeardownPerSec))
	}
	if r.CreatePerSecAtEnd != nil {
		t.row("  rate at end", fmt.Sprintf("%.2f/s (last 10%% of creations)", *r.CreatePerSecAtEnd))
	}
	if r.HostBytesPerSandbox != nil {
		t.row("  host memory", fmt.Sprintf("%s per sandbox", formatSize(*r.HostBytesPerSandbox)),
			fmt.Sprintf("(MemAvailable %s -> %s after %.0fs settle)", formatSize(*r.MemAvailableBefore), formatSize(*r.MemAvailableAfter), *r.SettleSeconds))
	}
	_ = t.flush()
}
