package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/client"
)

func newNodeCmd(a *app) *cobra.Command {
	cmd := group("node", "Show nodes and what fits on them", "nodes")
	cmd.AddCommand(newNodeLsCmd(a), newCapacityCmd(a))
	return cmd
}

func newNodeLsCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List nodes with their resources",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			nodes, err := c.Nodes(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if nodes == nil {
					nodes = []client.NodeInfo{}
				}
				return printJSON(a.stdout, nodes)
			}
			t := newTable(a.stdout, "NAME", "SANDBOXES", "CPUS", "CPU REQ", "CPU USED", "MEMORY", "AVAILABLE", "HELD", "RECLAIMABLE", "CGROUP", "FEATURES")
			for _, n := range nodes {
				t.row(n.Name, n.Sandboxes, n.CPUs, fmt.Sprintf("%.2f", n.CPURequested), fmt.Sprintf("%.2f", n.CPUUsed),
					formatSize(n.MemoryBytes), formatSize(n.MemAvailable), formatSize(n.MemoryHeldBytes),
					formatSize(n.MemoryReclaimableBytes), fmt.Sprintf("v%d", n.CgroupVersion), orDash(formatFeatures(n)))
			}
			return t.flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func formatFeatures(n client.NodeInfo) string {
	var parts []string
	if n.SchedCore {
		parts = append(parts, "sched_core")
	}
	keys := make([]string, 0, len(n.Features))
	for k := range n.Features {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		parts = append(parts, k+"="+n.Features[k])
	}
	return strings.Join(parts, ",")
}

func defaultShape() client.SandboxSpec {
	return client.SandboxSpec{CPU: 1, MemoryBytes: 512 << 20}
}

func newCapacityCmd(a *app) *cobra.Command {
	shape := defaultShape()
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "capacity [--cpu 1] [--memory 512Mi] [--disk D] [--pids N]",
		Short: "How many more sandboxes of a shape fit",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if shape.CPU <= 0 || shape.MemoryBytes <= 0 {
				return usagef("--cpu and --memory must be positive")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			cp, err := c.Capacity(cmd.Context(), shape)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.stdout, cp)
			}
			fmt.Fprintf(a.stdout, "%d more sandboxes of cpu %g, memory %s fit; limited by %s\n",
				cp.Fits, shape.CPU, formatSize(shape.MemoryBytes), orDash(cp.LimitingResource))
			if len(cp.Detail) > 0 {
				keys := make([]string, 0, len(cp.Detail))
				for k := range cp.Detail {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				t := newTable(a.stdout, "RESOURCE", "FITS")
				for _, k := range keys {
					t.row(k, cp.Detail[k])
				}
				return t.flush()
			}
			return nil
		},
	}
	addShapeFlags(cmd, &shape)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
