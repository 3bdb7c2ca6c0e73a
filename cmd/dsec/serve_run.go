package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	goruntime "runtime"
	"runtime/pprof"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/api"
	"github.com/dsec-dev/dsec/internal/image"
	"github.com/dsec-dev/dsec/internal/netpolicy"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/rootfs"
	"github.com/dsec-dev/dsec/internal/runtime"
	"github.com/dsec-dev/dsec/internal/sandboxfs"
	"github.com/dsec-dev/dsec/internal/seccomp"
	boltstore "github.com/dsec-dev/dsec/internal/store/bolt"
)

// sandboxCgroupParent is the cgroup below which every sandbox's group is
// named after its id.
const sandboxCgroupParent = "dsec/sandboxes"

// runServe wires the mechanisms into a node agent and the control plane,
// serves the APIs until ctx ends, and leaves running sandboxes running.
func runServe(ctx context.Context, o *serveOptions) (err error) {
	log, err := newLogger(o.logLevel)
	if err != nil {
		return err
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	if os.Geteuid() != 0 {
		return errors.New("dsec serve must run as root (it creates namespaces, mounts and cgroups)")
	}
	cfg, err := loadServerConfig(o.configFile)
	if err != nil {
		return err
	}
	memory, err := parseSize(o.memory)
	if err != nil {
		return usagef("--default-memory: %v", err)
	}
	disk, err := parseSize(o.disk)
	if err != nil {
		return usagef("--default-disk: %v", err)
	}
	outputKept, err := parseSize(o.execOutputKept)
	if err != nil || outputKept <= 0 {
		return usagef("--exec-output-kept %q: want a positive size such as 64Mi", o.execOutputKept)
	}
	if o.execHistory <= 0 {
		return usagef("--exec-history %d: want at least 1", o.execHistory)
	}
	if o.dataDir, err = filepath.Abs(o.dataDir); err != nil {
		return err
	}
	if err := os.MkdirAll(o.dataDir, 0o700); err != nil {
		return err
	}
	// The state store's file lock makes this the only server of the data
	// dir before anything below looks at its sandboxes: recovery removes
	// sandbox directories that have no record, which for a second server
	// would include the first one's creates in flight.
	st, err := boltstore.Open(filepath.Join(o.dataDir, "state.db"))
	if err != nil {
		return err
	}
	defer st.Close()

	// Mechanisms.
	cg, err := detectCgroups()
	if err != nil {
		return fmt.Errorf("cgroups: %w", err)
	}
	pool, err := rootfs.NewDiskPool(filepath.Join(o.dataDir, "disks"), rootfs.WithPoolLogger(log))
	if err != nil {
		return err
	}
	subvols, err := openSandboxDisks(ctx, o, log)
	if err != nil {
		return err
	}
	sandboxesDir := filepath.Join(o.dataDir, "node", "sandboxes")
	if subvols != nil {
		sandboxesDir = subvols.Root()
		// Runs after the agent and runtime are done (defers run last in,
		// first out): unmounts the node file system if no sandbox is left.
		defer func() {
			if err := subvols.Close(); err != nil {
				log.Warn("closing the sandboxes' file system", "err", err)
			}
		}()
	}
	o.sandboxesDir = sandboxesDir
	rt, err := runtime.NewNamespaceRuntime(cg,
		runtime.WithLogger(log.With("component", "runtime")),
		runtime.WithCgroupParent(sandboxCgroupParent),
		runtime.WithDiskPool(pool),
		runtime.WithSubvolumes(subvols),
		runtime.WithSharedSysfs(filepath.Join(o.dataDir, "node", "sysfs")),
		runtime.WithSeccomp(func(s runtime.Spec) ([]unix.SockFilter, error) {
			f, err := seccomp.SharedDefaultFilter(seccomp.Options{AllowUserNS: s.AllowUserNS})
			return f, err
		}),
	)
	if err != nil {
		return err
	}
	// Sandboxes keep running; this unmounts the node's shared sysfs (they
	// hold their own bind mounts of it).
	defer func() {
		if err := rt.Close(); err != nil {
			log.Warn("closing the runtime", "err", err)
		}
	}()
	blobs, err := openBlobStore(ctx, o.store, o.dataDir)
	if err != nil {
		return err
	}
	meta, err := image.NewDirMeta(filepath.Join(o.dataDir, "images"))
	if err != nil {
		return err
	}
	imgStore, err := image.NewStore(blobs, meta, image.WithLogger(log.With("component", "image")),
		image.WithTempDir(filepath.Join(o.dataDir, "tmp")))
	if err != nil {
		return err
	}
	lo := &layerdOptions{dataDir: o.dataDir, store: o.store, mode: o.layers, cacheSize: o.cacheSize,
		socket: filepath.Join(o.dataDir, "layerd.sock")}
	ld, err := ensureLayerd(ctx, lo, log)
	if err != nil {
		return err
	}
	var netw node.Network
	{
		ncfg := netpolicy.Config{Presets: cfg.Network.Presets, Exceptions: cfg.Network.Exceptions}
		if cfg.Network.Subnet != "" {
			if ncfg.Subnet, err = netip.ParsePrefix(cfg.Network.Subnet); err != nil {
				return fmt.Errorf("config network.subnet: %w", err)
			}
		}
		if ncfg.Protect, err = parseProtect(cfg.Network.Protect); err != nil {
			return err
		}
		nm, err := netpolicy.NewManager(ncfg, log.With("component", "netpolicy"))
		if err != nil {
			return fmt.Errorf("network policy: %w", err)
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = nm.Close(cctx)
		}()
		netw = network{nm}
	}

	imgs := &images{st: imgStore, layerd: ld, gcGrace: gcGrace(o)}
	eff, err := newEfficiency(ctx, o, cg, log)
	if err != nil {
		return err
	}
	defer eff.Close()
	agent, err := node.NewLocal(ctx, node.Config{
		Name: o.nodeName, DataDir: filepath.Join(o.dataDir, "node"), SandboxesDir: sandboxesDir,
		DefaultCPU: o.cpu, DefaultMemoryBytes: memory, DefaultPids: o.pids, DefaultDiskBytes: disk,
		DefaultEnv:    []string{"HOME=/root", "TERM=xterm"},
		TaskSchedIdle: eff.taskSchedIdle, Features: eff.features,
		Execs: node.ExecRetention{MaxEnded: o.execHistory, MaxOutputBytes: outputKept},
	}, node.Deps{
		Runtime: rt, Images: imgs, Layers: newLayerLeases(ld), Committer: imgs, Network: netw,
		Files: sandboxfs.Opener(), Stats: eff.stats, Admission: eff.adm,
		Orphans: rt,
	}, log.With("component", "node"))
	if err != nil {
		return err
	}
	imgs.inUse = func(ctx context.Context) []string {
		sbs, _ := agent.ListSandboxes(ctx)
		refs := make([]string, 0, len(sbs))
		for _, sb := range sbs {
			if sb.ImagePinned != "" {
				refs = append(refs, sb.ImagePinned)
			} else {
				refs = append(refs, sb.Spec.Image)
			}
		}
		return refs
	}

	// Control plane.
	nodeName := agent.Name()
	svc, err := api.NewService(api.Config{
		DataDir: o.dataDir, DefaultCPU: o.cpu, DefaultMemoryBytes: memory, DefaultDiskBytes: disk,
		ExecHistory: o.execHistory,
	}, st, api.StaticNodes{nodeName: agent}, imgs, log.With("component", "api"))
	if err != nil {
		return err
	}
	if err := svc.Start(ctx); err != nil {
		return err
	}
	defer svc.Close()
	if o.heapProfile != "" {
		// Written when the server stops, before anything is closed.
		defer func() {
			f, err := os.Create(o.heapProfile)
			if err != nil {
				return
			}
			defer f.Close()
			goruntime.GC()
			_ = pprof.WriteHeapProfile(f)
		}()
	}
	if err := svc.Registry().Register(imageMetrics{stats: imgs.AllStats, log: log.With("component", "metrics")}); err != nil {
		return err
	}

	stopReclaim, err := eff.start(ctx, agent, rt)
	if err != nil {
		return err
	}
	defer stopReclaim()

	servers := []func(context.Context) error{}
	h := api.NewHandler(svc, api.WithHandlerLogger(log.With("component", "http")))
	srv := api.NewServer(h, log)
	servers = append(servers, func(ctx context.Context) error { return srv.Serve(ctx, o.listen...) })
	if o.e2bListen != "" {
		e2b, err := newE2BServer(svc, o.e2bListen, log)
		if err != nil {
			return err
		}
		servers = append(servers, e2b)
	}
	log.Info("dsec serving", "listen", o.listen, "e2b", o.e2bListen, "data_dir", o.dataDir,
		"cgroup_version", cg.Version(), "layers", o.layers, "node", nodeName)
	errc := make(chan error, len(servers))
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, s := range servers {
		go func() { errc <- s(sctx) }()
	}
	var first error
	for range servers {
		if err := <-errc; err != nil && first == nil {
			first = err
			cancel()
		}
	}
	// With no sandbox left, nothing needs the layer daemon: stop it so a
	// stopped server leaves no mounts behind.
	if sbs, err := agent.ListSandboxes(context.Background()); err == nil && len(sbs) == 0 {
		qctx, qcancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := ld.Quit(qctx, false); err != nil {
			log.Warn("layer daemon kept running", "err", err)
		} else if err := waitUnmounted(qctx, filepath.Join(o.dataDir, "layers"), 30*time.Second); err != nil {
			log.Warn("layer daemon stopping", "err", err)
		}
		// And the empty parent cgroups: a stopped server leaves nothing.
		// Another server on this host (another data dir) may still have
		// sandboxes below them: then rmdir stays EBUSY, so try briefly
		// rather than waiting out qctx.
		for _, name := range []string{sandboxCgroupParent, path.Dir(sandboxCgroupParent)} {
			dctx, dcancel := context.WithTimeout(qctx, 200*time.Millisecond)
			if g, err := cg.Load(dctx, name); err == nil {
				_ = g.Delete(dctx)
			}
			dcancel()
		}
		qcancel()
	}
	log.Info("dsec stopped")
	return first
}

// openSandboxDisks opens the node's btrfs file system for sandboxes'
// private layers per --disks; nil means per-sandbox loop images.
func openSandboxDisks(ctx context.Context, o *serveOptions, log *slog.Logger) (*rootfs.Subvolumes, error) {
	var size int64
	if o.diskFSSize != "" {
		n, err := parseSize(o.diskFSSize)
		if err != nil {
			return nil, usagef("--disk-fs-size: %v", err)
		}
		size = n
	}
	switch o.disks {
	case "loop":
		return nil, nil
	case "btrfs", "auto":
	default:
		return nil, usagef("--disks %q: want auto, btrfs or loop", o.disks)
	}
	nodeDir := filepath.Join(o.dataDir, "node")
	sv, err := rootfs.OpenSubvolumes(ctx, filepath.Join(nodeDir, "private"), rootfs.SubvolumeOptions{
		Image: filepath.Join(nodeDir, "private.img"), Size: size, Logger: log.With("component", "disks"),
	})
	if err != nil {
		if o.disks == "auto" {
			log.Warn("btrfs subvolumes unavailable, sandbox disk limits use a loop device each (slower creates)", "err", err)
			return nil, nil
		}
		return nil, fmt.Errorf("--disks btrfs: %w", err)
	}
	return sv, nil
}
