package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/client"
)

func newSandboxCmd(a *app) *cobra.Command {
	cmd := group("sandbox", "Create and manage sandboxes", "sb")
	cmd.AddCommand(
		newSandboxCreateCmd(a),
		newSandboxLsCmd(a),
		newSandboxInspectCmd(a),
		newSandboxStatsCmd(a),
		simpleIDCmd(a, "pause ID", "Freeze every process of a sandbox", (*client.Client).Pause),
		simpleIDCmd(a, "resume ID", "Thaw a paused sandbox", (*client.Client).Resume),
		newSandboxRmCmd(a),
		newSandboxSnapshotCmd(a),
		newSandboxForkCmd(a),
		newSandboxNetworkCmd(a),
		newSandboxTimeoutCmd(a),
		newSandboxExecsCmd(a),
		newSandboxOutputCmd(a),
	)
	return cmd
}

// specFlags are the flags of `sandbox create`; the shape subset
// (addShapeFlags) is shared with capacity, top and bench.
type specFlags struct {
	spec   client.SandboxSpec
	labels map[string]string
}

func addShapeFlags(cmd *cobra.Command, s *client.SandboxSpec) {
	f := cmd.Flags()
	f.Float64Var(&s.CPU, "cpu", s.CPU, "CPU request in cores (0 = server default)")
	f.Var(sizeValue{&s.MemoryBytes}, "memory", "memory limit, e.g. 512Mi (0 = server default)")
	f.Var(sizeValue{&s.DiskBytes}, "disk", "writable layer size, e.g. 1Gi (0 = server default)")
	f.Int64Var(&s.Pids, "pids", s.Pids, "process limit (0 = server default)")
}

func addSpecFlags(cmd *cobra.Command, sf *specFlags) {
	s := &sf.spec
	sf.labels = map[string]string{}
	addShapeFlags(cmd, s)
	f := cmd.Flags()
	f.StringVar(&s.Image, "image", "", "image NAME[:TAG] (required)")
	f.Float64Var(&s.CPULimit, "cpu-limit", 0, "hard CPU limit in cores (0 = none)")
	f.Var(durationValue{&s.IdleTTL}, "idle-ttl", "act after this long without activity, e.g. 300s (0 = server default)")
	f.Var(durationValue{&s.MaxLifetime}, "max-lifetime", "delete after this long, e.g. 3h (0 = server default)")
	f.StringVar(&s.OnIdle, "on-idle", "", "what to do when idle: delete or pause (default delete)")
	f.Var(envValue{&s.Env}, "env", "environment variable KEY=VALUE (repeatable)")
	f.Var(labelValue{sf.labels}, "label", "label key=value (repeatable)")
	f.StringVar(&s.QoS, "qos", "", "QoS class: latency, standard or batch")
	f.Var(ruleValue{&s.Network.Allow}, "allow", "allow egress: CIDR[:PORTS][/tcp|udp] or preset:NAME (repeatable)")
	f.Var(ruleValue{&s.Network.Deny}, "deny", "deny egress: CIDR[:PORTS][/tcp|udp] (repeatable)")
	f.BoolVar(&s.AllowUserNS, "allow-userns", false, "let processes create user namespaces")
}

// validate checks what the flags cannot check one by one.
func (sf *specFlags) validate() error {
	s := &sf.spec
	switch s.OnIdle {
	case "", "delete", "pause":
	default:
		return usagef("invalid --on-idle %q: want delete or pause", s.OnIdle)
	}
	switch s.QoS {
	case "", client.QoSLatency, client.QoSStandard, client.QoSBatch:
	default:
		return usagef("invalid --qos %q: want latency, standard or batch", s.QoS)
	}
	if s.CPU < 0 || s.CPULimit < 0 || s.Pids < 0 {
		return usagef("--cpu, --cpu-limit and --pids must not be negative")
	}
	if s.CPULimit > 0 && s.CPU > s.CPULimit {
		return usagef("--cpu %.2f exceeds --cpu-limit %.2f", s.CPU, s.CPULimit)
	}
	for _, r := range s.Network.Deny {
		if r.Preset != "" {
			return usagef("--deny takes CIDR rules, not presets")
		}
	}
	if len(sf.labels) > 0 {
		s.Labels = sf.labels
	}
	return nil
}

func newSandboxCreateCmd(a *app) *cobra.Command {
	var sf specFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "create --image NAME [flags]",
		Short: "Create a sandbox and print its id",
		Example: `  dsec sandbox create --image python:3.12 --cpu 1 --memory 512Mi --allow preset:pypi
  dsec sandbox create --image base --label run=42 --env SEED=7 --idle-ttl 300s --on-idle pause`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sf.spec.Image == "" {
				return usagef("--image is required")
			}
			if err := sf.validate(); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.CreateSandbox(cmd.Context(), sf.spec)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.stdout, sb)
			}
			fmt.Fprintln(a.stdout, sb.ID)
			return nil
		},
	}
	addSpecFlags(cmd, &sf)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sandbox as JSON")
	return cmd
}

func newSandboxLsCmd(a *app) *cobra.Command {
	labels := map[string]string{}
	var state string
	var asJSON, quiet bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List sandboxes",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			sbs, err := c.ListSandboxes(cmd.Context(), labels, state)
			if err != nil {
				return err
			}
			if asJSON {
				if sbs == nil {
					sbs = []client.Sandbox{}
				}
				return printJSON(a.stdout, sbs)
			}
			if quiet {
				for _, sb := range sbs {
					fmt.Fprintln(a.stdout, sb.ID)
				}
				return nil
			}
			now := time.Now()
			t := newTable(a.stdout, "ID", "STATE", "IMAGE", "CPU", "MEMORY", "TENANT", "AGE", "IDLE", "LABELS")
			for _, sb := range sbs {
				t.row(sb.ID, sb.State, sb.Spec.Image, fmt.Sprintf("%g", sb.Spec.CPU), formatSize(sb.Spec.MemoryBytes),
					orDash(sb.Spec.Tenant), age(sb.CreatedAt, now), age(sb.LastActivity, now), orDash(formatLabels(sb.Spec.Labels)))
			}
			return t.flush()
		},
	}
	cmd.Flags().Var(labelValue{labels}, "label", "only sandboxes with label key=value (repeatable)")
	cmd.Flags().StringVar(&state, "state", "", "only sandboxes in this state (creating, running, paused, dead)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print ids only")
	return cmd
}

func formatLabels(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + m[k]
	}
	return strings.Join(keys, ",")
}

func newSandboxInspectCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect ID",
		Short: "Show a sandbox's details",
		Args:  exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.GetSandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			// Live figures only exist while its processes do.
			var st *client.SandboxStats
			if sb.State == client.StateRunning || sb.State == client.StatePaused {
				if st, err = c.Stats(cmd.Context(), sb.ID); err != nil {
					return err
				}
			}
			if asJSON {
				return printJSON(a.stdout, inspectView(sb, st))
			}
			s := sb.Spec
			var allow, deny []string
			for _, r := range s.Network.Allow {
				allow = append(allow, formatRule(r))
			}
			for _, r := range s.Network.Deny {
				deny = append(deny, formatRule(r))
			}
			return kv(a.stdout,
				"id", sb.ID, "state", sb.State+reason(sb.Reason), "image", s.Image, "tenant", orDash(s.Tenant), "node", orDash(sb.Node),
				"created", sb.CreatedAt.Format(time.RFC3339), "last activity", sb.LastActivity.Format(time.RFC3339),
				"cpu", fmt.Sprintf("%g (limit %g)", s.CPU, s.CPULimit), "memory", formatSize(s.MemoryBytes),
				"disk", formatSize(s.DiskBytes), "pids", s.Pids, "qos", orDash(s.QoS),
				"idle ttl", s.IdleTTL, "on idle", orDash(s.OnIdle), "max lifetime", s.MaxLifetime,
				"labels", orDash(formatLabels(s.Labels)), "env", orDash(strings.Join(s.Env, " ")),
				"allow", orDash(strings.Join(allow, " ")), "deny", orDash(strings.Join(deny, " ")),
				"cpu used", statOr(st, func(st *client.SandboxStats) string {
					return fmt.Sprintf("%.2f now, p50 %.2f, p95 %.2f (requested %g)", st.CPUUsed, st.CPUUsedP50, st.CPUUsedP95, st.CPURequested)
				}),
				"memory held", statOr(st, func(st *client.SandboxStats) string {
					return fmt.Sprintf("%s (reclaimable %s, reusable now %s, swapped %s)", formatSize(st.MemoryHeldBytes),
						formatSize(st.MemoryReclaimableBytes), formatSize(st.MemoryReusableBytes), formatSize(st.MemorySwappedBytes))
				}),
			)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// inspectView is the sandbox record with its live figures at the top
// level (memory_held_bytes, memory_reclaimable_bytes, cpu_requested,
// cpu_used, ...; zero when it is not running) and also under "stats".
func inspectView(sb *client.Sandbox, st *client.SandboxStats) any {
	type view struct {
		*client.Sandbox
		CPURequested           float64              `json:"cpu_requested"`
		CPUUsed                float64              `json:"cpu_used"`
		CPUUsedP95             float64              `json:"cpu_used_p95"`
		MemoryHeldBytes        int64                `json:"memory_held_bytes"`
		MemoryReclaimableBytes int64                `json:"memory_reclaimable_bytes"`
		MemoryReusableBytes    int64                `json:"memory_reusable_bytes"`
		MemorySwappedBytes     int64                `json:"memory_swapped_bytes"`
		Stats                  *client.SandboxStats `json:"stats,omitempty"`
	}
	v := view{Sandbox: sb, CPURequested: sb.Spec.CPU, Stats: st}
	if st != nil {
		v.CPURequested, v.CPUUsed, v.CPUUsedP95 = st.CPURequested, st.CPUUsed, st.CPUUsedP95
		v.MemoryHeldBytes, v.MemoryReclaimableBytes = st.MemoryHeldBytes, st.MemoryReclaimableBytes
		v.MemoryReusableBytes, v.MemorySwappedBytes = st.MemoryReusableBytes, st.MemorySwappedBytes
	}
	return v
}

func statOr(st *client.SandboxStats, f func(*client.SandboxStats) string) string {
	if st == nil {
		return "-"
	}
	return f(st)
}

func reason(r string) string {
	if r == "" {
		return ""
	}
	return " (" + r + ")"
}

func newSandboxStatsCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stats ID",
		Short: "Show live resource use of a sandbox",
		Args:  exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			st, err := c.Stats(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.stdout, st)
			}
			return kv(a.stdout,
				"id", st.ID, "state", st.State,
				"cpu", fmt.Sprintf("%.2f used / %g requested (p50 %.2f, p95 %.2f), %.1fs total, %.1fs throttled",
					st.CPUUsed, st.CPURequested, st.CPUUsedP50, st.CPUUsedP95, st.CPUUsageSeconds, st.CPUThrottledSeconds),
				"memory", fmt.Sprintf("%s held / %s limit, %s reclaimable", formatSize(st.MemoryHeldBytes), formatSize(st.MemoryLimitBytes), formatSize(st.MemoryReclaimableBytes)),
				"memory detail", fmt.Sprintf("anon %s, file %s, shmem %s, kernel %s, swapped %s",
					formatSize(st.MemoryAnonBytes), formatSize(st.MemoryFileBytes), formatSize(st.MemoryShmemBytes), formatSize(st.MemoryKernelBytes), formatSize(st.MemorySwappedBytes)),
				"pids", st.PidsCurrent, "disk used", formatSize(st.DiskUsedBytes), "oom kills", st.OOMKills,
				"pressure avg10", fmt.Sprintf("cpu %.2f%%, memory %.2f%%", st.CPUPressureAvg10, st.MemoryPressureAvg10),
			)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func simpleIDCmd(a *app, use, short string, fn func(*client.Client, context.Context, string) error) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			return fn(c, cmd.Context(), args[0])
		},
	}
}

func newSandboxRmCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "rm ID...",
		Aliases: []string{"delete", "kill"},
		Short:   "Delete sandboxes",
		Args:    minArgs(1, "at least one sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			// Delete all that can be deleted; report every failure.
			var errs []error
			for _, id := range args {
				if err := c.DeleteSandbox(cmd.Context(), id); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", id, err))
					continue
				}
				fmt.Fprintln(a.stdout, id)
			}
			if len(errs) > 1 {
				for _, e := range errs[:len(errs)-1] {
					fmt.Fprintf(a.stderr, "dsec: %s\n", oneLine(e.Error()))
				}
			}
			return lastErr(errs)
		},
	}
}

func lastErr(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return errs[len(errs)-1]
}

func newSandboxSnapshotCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "snapshot ID NAME[:TAG]",
		Short: "Commit a sandbox's file system as a new image version",
		Args:  exactArgs(2, "a sandbox ID and an image NAME[:TAG]"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			img, err := c.Snapshot(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.stdout, img)
			}
			fmt.Fprintf(a.stdout, "%s %s\n", img.Name, img.Digest)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newSandboxForkCmd(a *app) *cobra.Command {
	var count int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "fork ID --count N",
		Short: "Start N sandboxes from a copy of a sandbox's file system",
		Args:  exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if count < 1 {
				return usagef("--count must be at least 1")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			sbs, err := c.Fork(cmd.Context(), args[0], count)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.stdout, sbs)
			}
			for _, sb := range sbs {
				fmt.Fprintln(a.stdout, sb.ID)
			}
			return nil
		},
	}
	cmd.Flags().IntVarP(&count, "count", "n", 1, "number of forks")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newSandboxNetworkCmd(a *app) *cobra.Command {
	var pol client.NetworkPolicy
	cmd := &cobra.Command{
		Use:   "network ID [--allow RULE]... [--deny RULE]...",
		Short: "Replace a sandbox's egress policy (no rules = loopback only)",
		Example: `  dsec sandbox network sb-123 --allow preset:pypi --allow 10.0.0.0/8:443/tcp --deny 10.0.0.5
  dsec sandbox network sb-123    # cut all egress`,
		Args: exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, r := range pol.Deny {
				if r.Preset != "" {
					return usagef("--deny takes CIDR rules, not presets")
				}
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.SetNetwork(cmd.Context(), args[0], pol)
		},
	}
	cmd.Flags().Var(ruleValue{&pol.Allow}, "allow", "allow egress: CIDR[:PORTS][/tcp|udp] or preset:NAME (repeatable)")
	cmd.Flags().Var(ruleValue{&pol.Deny}, "deny", "deny egress: CIDR[:PORTS][/tcp|udp] (repeatable)")
	return cmd
}

func newSandboxTimeoutCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "timeout ID DURATION",
		Short: "Make a sandbox expire DURATION from now (e.g. 10m)",
		Args:  exactArgs(2, "a sandbox ID and a duration"),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := parseDuration(args[1])
			if err != nil {
				return usageError{err}
			}
			if d == 0 {
				return usagef("timeout must be positive (use `dsec sandbox rm` to delete now)")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.SetTimeout(cmd.Context(), args[0], d)
		},
	}
}
