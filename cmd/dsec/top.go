package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/client"
)

func newTopCmd(a *app) *cobra.Command {
	shape := defaultShape()
	var once bool
	var interval time.Duration = time.Second
	var limit int
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Live view of the node: sandboxes, CPU, memory, what limits growth",
		Long: `Live view of the node, refreshed every second: sandboxes by state, CPU used
vs requested, memory held vs reusable (reclaimable), how many more
sandboxes of a shape (--cpu/--memory) fit and which resource limits that,
and the busiest sandboxes. Ctrl-C quits; --once prints one frame.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval < 100*time.Millisecond {
				return usagef("--interval must be at least 100ms")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			for {
				var buf bytes.Buffer
				if err := topFrame(ctx, c, &buf, shape, limit); err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
				if !once {
					io.WriteString(a.stdout, "\033[H\033[2J")
				}
				if _, err := a.stdout.Write(buf.Bytes()); err != nil {
					return err
				}
				if once {
					return nil
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(interval):
				}
			}
		},
	}
	addShapeFlags(cmd, &shape)
	cmd.Flags().BoolVar(&once, "once", false, "print one frame and exit")
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "refresh interval")
	cmd.Flags().IntVar(&limit, "limit", 20, "sandboxes shown, busiest first")
	return cmd
}

// topFrame renders one frame. Per-sandbox stats are fetched concurrently
// (bounded) so a busy node still refreshes within the interval.
func topFrame(ctx context.Context, c *client.Client, w io.Writer, shape client.SandboxSpec, limit int) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return err
	}
	sbs, err := c.ListSandboxes(ctx, nil, "")
	if err != nil {
		return err
	}
	cp, cpErr := c.Capacity(ctx, shape)

	states := map[string]int{}
	for _, sb := range sbs {
		states[sb.State]++
	}
	stats := make([]*client.SandboxStats, len(sbs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, sb := range sbs {
		if sb.State != client.StateRunning && sb.State != client.StatePaused {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if st, err := c.Stats(ctx, sb.ID); err == nil {
				stats[i] = st
			}
		}()
	}
	wg.Wait()

	fmt.Fprintf(w, "dsec top  %s  %s\n\n", c.Addr(), time.Now().Format(time.TimeOnly))
	var total client.NodeInfo
	for _, n := range nodes {
		total.CPUs += n.CPUs
		total.CPURequested += n.CPURequested
		total.CPUUsed += n.CPUUsed
		total.MemoryBytes += n.MemoryBytes
		total.MemAvailable += n.MemAvailable
		total.MemoryHeldBytes += n.MemoryHeldBytes
		total.MemoryReclaimableBytes += n.MemoryReclaimableBytes
	}
	var stateParts []string
	for _, s := range []string{client.StateRunning, client.StatePaused, client.StateCreating, client.StateDead} {
		stateParts = append(stateParts, fmt.Sprintf("%s %d", s, states[s]))
	}
	t := newTable(w)
	t.row("nodes", len(nodes))
	t.row("sandboxes", fmt.Sprintf("%d  (%s)", len(sbs), strings.Join(stateParts, ", ")))
	t.row("cpu", fmt.Sprintf("%.2f used / %.2f requested / %d cores (%.0f%% requested)",
		total.CPUUsed, total.CPURequested, total.CPUs, pct(total.CPURequested, float64(total.CPUs))))
	t.row("memory", fmt.Sprintf("%s held, %s reclaimable, %s available (reusable now) / %s",
		formatSize(total.MemoryHeldBytes), formatSize(total.MemoryReclaimableBytes), formatSize(total.MemAvailable), formatSize(total.MemoryBytes)))
	if cpErr == nil {
		t.row("capacity", fmt.Sprintf("%d more of cpu %g / memory %s; limiting resource: %s",
			cp.Fits, shape.CPU, formatSize(shape.MemoryBytes), orDash(cp.LimitingResource)))
	} else {
		t.row("capacity", "unknown: "+oneLine(cpErr.Error()))
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)

	type row struct {
		sb client.Sandbox
		st *client.SandboxStats
	}
	rows := make([]row, len(sbs))
	for i := range sbs {
		rows[i] = row{sbs[i], stats[i]}
	}
	sort.SliceStable(rows, func(i, j int) bool {
		return cpuOf(rows[i].st) > cpuOf(rows[j].st)
	})
	if limit > 0 && len(rows) > limit {
		rows = rows[:limit]
	}
	tt := newTable(w, "ID", "STATE", "IMAGE", "CPU", "REQ", "MEM HELD", "RECLAIM", "LIMIT", "PIDS", "IDLE")
	now := time.Now()
	for _, r := range rows {
		if r.st == nil {
			tt.row(r.sb.ID, r.sb.State, r.sb.Spec.Image, "-", fmt.Sprintf("%g", r.sb.Spec.CPU), "-", "-", formatSize(r.sb.Spec.MemoryBytes), "-", age(r.sb.LastActivity, now))
			continue
		}
		tt.row(r.sb.ID, r.sb.State, r.sb.Spec.Image, fmt.Sprintf("%.2f", r.st.CPUUsed), fmt.Sprintf("%g", r.st.CPURequested),
			formatSize(r.st.MemoryHeldBytes), formatSize(r.st.MemoryReclaimableBytes), formatSize(r.st.MemoryLimitBytes),
			r.st.PidsCurrent, age(r.sb.LastActivity, now))
	}
	return tt.flush()
}

func cpuOf(st *client.SandboxStats) float64 {
	if st == nil {
		return -1
	}
	return st.CPUUsed
}

func pct(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * a / b
}
