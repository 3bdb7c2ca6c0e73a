package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/layerd"
	"github.com/dsec-dev/dsec/internal/node"
)

// serveOptions are the flags of `dsec serve`.
type serveOptions struct {
	dataDir string
	// execHistory and execOutputKept bound what each sandbox keeps of its
	// ended execs (node.ExecRetention).
	execHistory    int
	execOutputKept string
	listen         []string
	e2bListen      string
	store          string
	layers         string
	cacheSize      string
	gcGrace        time.Duration
	nodeName       string
	configFile     string
	cpu            float64
	memory         string
	disk           string
	disks          string
	// sandboxesDir is where sandbox dirs go (set by runServe).
	sandboxesDir string
	diskFSSize   string
	pids         int64
	swap         string
	reclaimIdle  time.Duration
	overcommit   float64
	cpuProfile   string
	heapProfile  string
	expectedCPU  float64
	memReserve   string
	logLevel     string
}

// serverConfig is the optional operator config file (JSON).
type serverConfig struct {
	Network struct {
		Subnet     string                        `json:"subnet"`
		Presets    map[string][]node.NetworkRule `json:"presets"`
		Exceptions []node.NetworkRule            `json:"exceptions"`
		Protect    []string                      `json:"protect"`
	} `json:"network"`
}

func newServeCmd() *cobra.Command {
	o := &serveOptions{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the dsec server (control plane and node agent) on this host",
		Long: `Run the dsec server: the API (unix socket and/or TCP with tokens), the
control plane and the node agent of this host. Sandboxes keep running when
the server stops or is killed; started again, it adopts them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runServe(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dataDir, "data-dir", "/var/lib/dsec", "where state, blobs, layers and sandboxes live")
	f.StringArrayVar(&o.listen, "listen", []string{"unix:///run/dsec/dsec.sock"}, "API listener: unix:///path (root only) or tcp://host:port (bearer tokens); repeatable")
	f.StringVar(&o.e2bListen, "e2b-listen", "", "E2B-compatible API listener, tcp://host:port (off when empty)")
	f.StringVar(&o.store, "store", "", "blob store: dir:/path (a local disk or a shared mount) or s3://host/bucket/prefix (default DATA-DIR/blobs)")
	f.StringVar(&o.layers, "layers", "lazy", "how layers reach this node: lazy (FUSE, chunks fetched on first read) or unpacked")
	f.StringVar(&o.cacheSize, "cache-size", "20Gi", "node chunk cache size (lazy layers)")
	f.DurationVar(&o.gcGrace, "gc-grace", -1, "image gc spares unreferenced blobs younger than this (default 0 with the private DATA-DIR/blobs store, 1h with --store, which other nodes may be writing to)")
	f.StringVar(&o.nodeName, "node-name", "", "this node's name (default the hostname)")
	f.StringVar(&o.configFile, "config", "", "operator config file (JSON): network presets, exceptions, protected ranges")
	f.Float64Var(&o.cpu, "default-cpu", 1, "CPU request of a sandbox that names none (cores)")
	f.StringVar(&o.memory, "default-memory", "512Mi", "memory limit of a sandbox that names none")
	f.StringVar(&o.disk, "default-disk", "1Gi", "disk limit (private writable layer) of a sandbox that names none")
	f.StringVar(&o.disks, "disks", "auto", "how sandboxes' private layers are kept and limited: btrfs (a subvolume each with a quota, on DATA-DIR/node/private: a btrfs mount, or an image made and mounted there), loop (an ext4 image and loop device each), or auto (btrfs when the kernel and mkfs.btrfs allow, else loop)")
	f.StringVar(&o.diskFSSize, "disk-fs-size", "", "size of the node's btrfs image for --disks btrfs when it is made (default the free space of DATA-DIR's file system); sandboxes' limits may add up to more")
	f.Int64Var(&o.pids, "default-pids", 512, "pids limit of a sandbox that names none")
	f.IntVar(&o.execHistory, "exec-history", node.DefaultMaxEndedExecs, "ended execs (result and kept output) each sandbox keeps; the oldest are forgotten first")
	f.StringVar(&o.execOutputKept, "exec-output-kept", "64Mi", "output of ended execs each sandbox keeps on the node, all execs together; the oldest are forgotten first, the newest always kept")
	f.StringVar(&o.swap, "swap", "", "compressed swap tier to set up while serving, e.g. zram:4Gi (off by default)")
	f.DurationVar(&o.reclaimIdle, "reclaim-idle-after", 0, "push cold memory of sandboxes idle this long out (0 = off)")
	f.Float64Var(&o.overcommit, "cpu-overcommit", 20, "admit sandboxes while measured CPU use stays under cores x this")
	f.Float64Var(&o.expectedCPU, "expected-cpu-fraction", 0.05, "share of its CPU request a new sandbox is expected to use until measured, while fewer than 5 sandboxes are measured (then their average stands in)")
	f.StringVar(&o.memReserve, "memory-reserve", "512Mi", "admit sandboxes while memory held + a newcomer's limit + this fits in physical memory")
	f.StringVar(&o.cpuProfile, "cpu-profile", "", "write a Go CPU profile of the server to this file until it stops (diagnostics)")
	_ = f.MarkHidden("cpu-profile")
	f.StringVar(&o.heapProfile, "heap-profile", "", "write a Go heap profile of the server to this file when it stops (diagnostics)")
	_ = f.MarkHidden("heap-profile")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}

func newLogger(level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lv})), nil
}

func loadServerConfig(path string) (*serverConfig, error) {
	cfg := &serverConfig{}
	if path == "" {
		return cfg, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(cfg); err != nil {
		return nil, fmt.Errorf("--config %s: %v", path, err)
	}
	return cfg, nil
}

func parseProtect(in []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range in {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, err2 := netip.ParseAddr(s)
			if err2 != nil {
				return nil, fmt.Errorf("protect %q: %v", s, err)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p)
	}
	return out, nil
}

// ensureLayerd finds the node's layer daemon or starts one in its own
// session, so it outlives this server (see internal/layerd).
func ensureLayerd(ctx context.Context, o *layerdOptions, log *slog.Logger) (*layerd.Client, error) {
	c := layerd.NewClient(o.socket)
	if c.Ping(ctx) == nil {
		log.Info("found the running layer daemon", "socket", o.socket)
		return c, nil
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(filepath.Join(o.dataDir, "layerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(self, o.args()...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start layer daemon: %w", err)
	}
	pid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if c.Ping(ctx) == nil {
			log.Info("started the layer daemon", "pid", pid, "socket", o.socket)
			return c, nil
		}
		select {
		case err := <-exited:
			b, _ := os.ReadFile(filepath.Join(o.dataDir, "layerd.log"))
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			return nil, fmt.Errorf("layer daemon exited (%v): %s", err, lines[len(lines)-1])
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, errors.New("layer daemon did not answer within 15s")
		}
	}
}

// newLayerdStopCmd stops the node's layer daemon (tests and operators).
func newLayerdStopCmd() *cobra.Command {
	var dataDir, socket string
	var force bool
	cmd := &cobra.Command{
		Use:    "layerd-stop",
		Short:  "Stop the node's layer daemon (refused while sandboxes use layers, unless --force)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if socket == "" {
				socket = filepath.Join(dataDir, "layerd.sock")
			}
			c := layerd.NewClient(socket)
			if c.Ping(cmd.Context()) == nil {
				if err := c.Quit(cmd.Context(), force); err != nil {
					return err
				}
				for i := 0; i < 300 && c.Ping(cmd.Context()) == nil; i++ {
					time.Sleep(20 * time.Millisecond)
				}
			}
			// The daemon unmounts its layers after it stopped serving (and
			// may have been asked to stop by the server already): return
			// once they are gone, so that a caller may remove the data dir.
			return waitUnmounted(cmd.Context(), filepath.Join(dataDir, "layers"), 30*time.Second)
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "/var/lib/dsec", "data directory")
	cmd.Flags().StringVar(&socket, "socket", "", "daemon socket (default DATA-DIR/layerd.sock)")
	cmd.Flags().BoolVar(&force, "force", false, "stop even while layers are leased")
	return cmd
}

func detectCgroups() (cgroups.Manager, error) {
	return cgroups.Detect("/sys/fs/cgroup")
}

// waitUnmounted waits until nothing is mounted below dir.
func waitUnmounted(ctx context.Context, dir string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		left, err := mountsBelow(dir)
		if err != nil || len(left) == 0 {
			return err
		}
		stale := 0
		for _, p := range left {
			// A FUSE mount whose daemon died answers ENOTCONN: nobody
			// will unmount it, so waiting is pointless.
			if _, err := os.Stat(p); errors.Is(err, syscall.ENOTCONN) {
				stale++
			}
		}
		if stale == len(left) || time.Now().After(deadline) {
			return fmt.Errorf("%d layers are still mounted below %s (e.g. %s; %d of a dead layer daemon): %w", len(left), dir, left[0], stale, errdefs.ErrUnavailable)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// mountsBelow lists the mount points strictly below dir.
func mountsBelow(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	prefix := filepath.Clean(dir) + "/"
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		// Field 5 is the mount point, octal-escaped.
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(unescapeMount(f[4]), prefix) {
			out = append(out, unescapeMount(f[4]))
		}
	}
	return out, nil
}

func unescapeMount(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
