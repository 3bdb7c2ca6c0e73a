package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/image"
	"github.com/dsec-dev/dsec/internal/layerd"
	"github.com/dsec-dev/dsec/internal/lazyfs"
)

// layerdOptions configure the node's layer daemon; `dsec serve` passes its
// own flags through.
type layerdOptions struct {
	dataDir   string
	store     string
	mode      string // lazy | unpacked
	cacheSize string
	socket    string
}

func (o *layerdOptions) args() []string {
	return []string{"layerd", "--data-dir", o.dataDir, "--store", o.store, "--layers", o.mode,
		"--cache-size", o.cacheSize, "--socket", o.socket}
}

func newLayerdCmd() *cobra.Command {
	o := &layerdOptions{}
	cmd := &cobra.Command{
		Use:    "layerd",
		Short:  "Serve the node's shared image layers (started by dsec serve)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runLayerd(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dataDir, "data-dir", "/var/lib/dsec", "data directory")
	f.StringVar(&o.store, "store", "", "blob store: dir:/path or s3://host/bucket/prefix (default: DATA-DIR/blobs)")
	f.StringVar(&o.mode, "layers", "lazy", "how layers reach the node: lazy (FUSE, fetched chunk by chunk) or unpacked")
	f.StringVar(&o.cacheSize, "cache-size", "20Gi", "size of the node's chunk cache (lazy layers)")
	f.StringVar(&o.socket, "socket", "", "unix socket (default DATA-DIR/layerd.sock)")
	return cmd
}

// lazyStats adapts lazyfs figures to the daemon's.
type lazyStats struct{ m *lazyfs.Mounter }

func (s lazyStats) SetImage(key string, layers []blob.Digest) { s.m.SetImage(key, layers) }
func (s lazyStats) ImageStats(key string) (layerd.Stats, bool) {
	st, ok := s.m.ImageStats(key)
	return layerd.Stats{
		ImageBytes: st.ImageBytes, FetchedBytes: st.FetchedBytes, ReadBytes: st.ReadBytes,
		TransferredBytes: st.TransferredBytes, MetadataRequests: st.MetadataRequests,
		CacheHits: int64(st.Hits), CacheMisses: int64(st.Misses), FetchWaitSecs: st.FetchWait.Seconds(),
	}, ok
}

func runLayerd(ctx context.Context, o *layerdOptions) error {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "layerd")
	if o.socket == "" {
		o.socket = filepath.Join(o.dataDir, "layerd.sock")
	}
	store, err := openBlobStore(ctx, o.store, o.dataDir)
	if err != nil {
		return err
	}
	var d *layerd.Daemon
	switch o.mode {
	case "lazy":
		size, err := parseSize(o.cacheSize)
		if err != nil {
			return fmt.Errorf("--cache-size: %w", err)
		}
		cache, err := lazyfs.NewChunkCache(filepath.Join(o.dataDir, "chunk-cache"), size, lazyfs.WithCacheLogger(log))
		if err != nil {
			return err
		}
		m, err := lazyfs.NewMounter(filepath.Join(o.dataDir, "layers"), store, cache,
			lazyfs.WithLogger(log),
			lazyfs.WithPrefetchLists(lazyfs.DirPrefetchLists{Dir: filepath.Join(o.dataDir, "prefetch")}),
			lazyfs.WithPassthrough(true))
		if err != nil {
			return err
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := m.Close(cctx); err != nil {
				log.Error("unmount layers", "err", err)
			}
		}()
		d = layerd.New(m, lazyStats{m}, log)
	case "unpacked":
		p, err := image.NewUnpackProvider(filepath.Join(o.dataDir, "unpacked"), store, log)
		if err != nil {
			return err
		}
		d = layerd.New(p, nil, log)
	default:
		return usagef("--layers %q: want lazy or unpacked", o.mode)
	}
	// The pid file lets `dsec layerd-stop` wait until the mounts are gone,
	// which happens after the socket has closed.
	pidFile := o.socket + ".pid"
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return err
	}
	defer os.Remove(pidFile)
	log.Info("layer daemon serving", "socket", o.socket, "layers", o.mode)
	return d.Serve(ctx, o.socket)
}

func init() {
	registerCommand(newLayerdCmd)
	registerCommand(newLayerdStopCmd)
}
