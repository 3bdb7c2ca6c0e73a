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
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/layerd"
	"github.com/dsec-dev/dsec/internal/node"
)

// serveOptions are the flags of `dsec serve`.
type serveOptions struct {
	dataDir     string
	listen      []string
	e2bListen   string
	store       string
	layers      string
	cacheSize   string
	nodeName    string
	configFile  string
	cpu         float64
	memory      string
	disk        string
	pids        int64
	swap        string
	reclaimIdle time.Duration
	overcommit  float64
	logLevel    string
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
	f.StringVar(&o.nodeName, "node-name", "", "this node's name (default the hostname)")
	f.StringVar(&o.configFile, "config", "", "operator config file (JSON): network presets, exceptions, protected ranges")
	f.Float64Var(&o.cpu, "default-cpu", 1, "CPU request of a sandbox that names none (cores)")
	f.StringVar(&o.memory, "default-memory", "512Mi", "memory limit of a sandbox that names none")
	f.StringVar(&o.disk, "default-disk", "0", "disk limit of a sandbox that names none (0 = no separate file system)")
	f.Int64Var(&o.pids, "default-pids", 512, "pids limit of a sandbox that names none")
	f.StringVar(&o.swap, "swap", "", "compressed swap tier to set up while serving, e.g. zram:4Gi (off by default)")
	f.DurationVar(&o.reclaimIdle, "reclaim-idle-after", 0, "push cold memory of sandboxes idle this long out (0 = off)")
	f.Float64Var(&o.overcommit, "cpu-overcommit", 20, "admit sandboxes while measured CPU use stays under cores x this")
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
			if c.Ping(cmd.Context()) != nil {
				return nil
			}
			if err := c.Quit(cmd.Context(), force); err != nil {
				return err
			}
			for i := 0; i < 300 && c.Ping(cmd.Context()) == nil; i++ {
				time.Sleep(20 * time.Millisecond)
			}
			return nil
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
