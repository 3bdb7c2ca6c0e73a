// Package layerd is the node's layer daemon: it owns the shared read-only
// layer directories (FUSE mounts of lazyfs, or unpacked directories) on
// behalf of the server.
//
// FUSE mounts die with the process serving them. If the server served the
// layers itself, killing the server would break the root file system of
// every running sandbox. The daemon runs in its own session and outlives the
// server; a restarted server reconnects and adopts its leases.
//
// Leases are keyed by (layer, holder), holder being a sandbox id, which
// makes every call idempotent: a restarted server re-acquires what its
// adopted sandboxes use and then calls Sync with the live holders, which
// drops the leases of sandboxes that are gone.
package layerd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Provider makes a layer available as a shared directory.
type Provider interface {
	Acquire(ctx context.Context, layer blob.Digest) (string, func(), error)
}

// StatsSource is implemented by providers that keep lazy-loading figures.
type StatsSource interface {
	SetImage(key string, layers []blob.Digest)
	ImageStats(key string) (Stats, bool)
}

// Stats are lazy-loading figures of one image on this node.
type Stats struct {
	ImageBytes   int64 `json:"image_bytes"`
	FetchedBytes int64 `json:"fetched_bytes"`
	// TransferredBytes: what the fetches read from the store (chunks as
	// stored, compressed where that saved space).
	TransferredBytes int64   `json:"transferred_bytes"`
	ReadBytes        int64   `json:"read_bytes"`
	MetadataRequests uint64  `json:"metadata_requests"`
	CacheHits        int64   `json:"cache_hits"`
	CacheMisses      int64   `json:"cache_misses"`
	FetchWaitSecs    float64 `json:"fetch_wait_seconds"`
}

type lease struct {
	path    string
	release func()
}

// Daemon serves leases over a unix socket.
type Daemon struct {
	provider Provider
	stats    StatsSource // may be nil
	log      *slog.Logger

	mu     sync.Mutex
	leases map[string]map[blob.Digest]*lease // holder -> layer -> lease
	quit   chan struct{}
	once   sync.Once
}

// New returns a daemon over provider. stats may be nil.
func New(provider Provider, stats StatsSource, log *slog.Logger) *Daemon {
	if log == nil {
		log = slog.Default()
	}
	return &Daemon{provider: provider, stats: stats, log: log,
		leases: map[string]map[blob.Digest]*lease{}, quit: make(chan struct{})}
}

// Acquire gives holder a lease on layer; acquiring twice is one lease.
func (d *Daemon) Acquire(ctx context.Context, layer blob.Digest, holder string) (string, error) {
	if holder == "" {
		return "", fmt.Errorf("layerd: a holder is required: %w", errdefs.ErrInvalidArgument)
	}
	d.mu.Lock()
	if l := d.leases[holder][layer]; l != nil {
		d.mu.Unlock()
		return l.path, nil
	}
	d.mu.Unlock()
	path, release, err := d.provider.Acquire(ctx, layer)
	if err != nil {
		return "", err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if l := d.leases[holder][layer]; l != nil { // raced with ourselves
		release()
		return l.path, nil
	}
	if d.leases[holder] == nil {
		d.leases[holder] = map[blob.Digest]*lease{}
	}
	d.leases[holder][layer] = &lease{path: path, release: release}
	return path, nil
}

// Release drops holder's lease on layer, or all its leases if layer is "".
func (d *Daemon) Release(layer blob.Digest, holder string) {
	d.mu.Lock()
	var rel []func()
	for ly, l := range d.leases[holder] {
		if layer == "" || ly == layer {
			rel = append(rel, l.release)
			delete(d.leases[holder], ly)
		}
	}
	if len(d.leases[holder]) == 0 {
		delete(d.leases, holder)
	}
	d.mu.Unlock()
	for _, r := range rel {
		r()
	}
}

// Sync drops the leases of every holder not in live and returns how many
// holders it dropped.
func (d *Daemon) Sync(live []string) int {
	keep := map[string]bool{}
	for _, h := range live {
		keep[h] = true
	}
	d.mu.Lock()
	var gone []string
	for h := range d.leases {
		if !keep[h] {
			gone = append(gone, h)
		}
	}
	d.mu.Unlock()
	for _, h := range gone {
		d.Release("", h)
	}
	return len(gone)
}

// Holders lists holders with at least one lease.
func (d *Daemon) Holders() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, 0, len(d.leases))
	for h := range d.leases {
		out = append(out, h)
	}
	sort.Strings(out)
	return out
}

// Done is closed when a client asked the daemon to exit.
func (d *Daemon) Done() <-chan struct{} { return d.quit }

type acquireReq struct {
	Layer  blob.Digest `json:"layer"`
	Holder string      `json:"holder"`
}

type imageReq struct {
	Key    string        `json:"key"`
	Layers []blob.Digest `json:"layers"`
}

// Handler is the daemon's HTTP face.
func (d *Daemon) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /acquire", func(w http.ResponseWriter, r *http.Request) {
		var req acquireReq
		if !decode(w, r, &req) {
			return
		}
		path, err := d.Acquire(r.Context(), req.Layer, req.Holder)
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, map[string]string{"path": path})
	})
	mux.HandleFunc("POST /release", func(w http.ResponseWriter, r *http.Request) {
		var req acquireReq
		if !decode(w, r, &req) {
			return
		}
		d.Release(req.Layer, req.Holder)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /sync", func(w http.ResponseWriter, r *http.Request) {
		var live []string
		if !decode(w, r, &live) {
			return
		}
		writeJSON(w, map[string]int{"dropped": d.Sync(live)})
	})
	mux.HandleFunc("GET /holders", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, d.Holders())
	})
	mux.HandleFunc("POST /images", func(w http.ResponseWriter, r *http.Request) {
		var req imageReq
		if !decode(w, r, &req) {
			return
		}
		if d.stats != nil {
			d.stats.SetImage(req.Key, req.Layers)
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /images/stats", func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Query().Get("key")
		if d.stats == nil {
			writeErr(w, fmt.Errorf("this layer provider keeps no statistics: %w", errdefs.ErrNotImplemented))
			return
		}
		st, ok := d.stats.ImageStats(key)
		if !ok {
			writeErr(w, fmt.Errorf("image %q has no statistics on this node: %w", key, errdefs.ErrNotFound))
			return
		}
		writeJSON(w, st)
	})
	mux.HandleFunc("POST /quit", func(w http.ResponseWriter, r *http.Request) {
		if len(d.Holders()) > 0 && r.URL.Query().Get("force") != "true" {
			writeErr(w, fmt.Errorf("layers are still leased: %w", errdefs.ErrFailedPrecondition))
			return
		}
		w.WriteHeader(http.StatusNoContent)
		d.once.Do(func() { close(d.quit) })
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// Serve listens on the unix socket at path until ctx ends or a client
// asks the daemon to quit.
func (d *Daemon) Serve(ctx context.Context, path string) error {
	if c := NewClient(path); c.Ping(ctx) == nil {
		return fmt.Errorf("layerd: another daemon already serves %s: %w", path, errdefs.ErrAlreadyExists)
	}
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("layerd: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return err
	}
	srv := &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
	case <-d.quit:
	case err := <-errc:
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	_ = os.Remove(path)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(v); err != nil {
		writeErr(w, fmt.Errorf("bad request body: %v: %w", err, errdefs.ErrInvalidArgument))
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// codes maps error classes to wire codes and back (see client.go).
var codes = []struct {
	class  error
	code   string
	status int
}{
	{errdefs.ErrNotFound, "not_found", http.StatusNotFound},
	{errdefs.ErrInvalidArgument, "invalid_argument", http.StatusBadRequest},
	{errdefs.ErrAlreadyExists, "already_exists", http.StatusConflict},
	{errdefs.ErrFailedPrecondition, "failed_precondition", http.StatusConflict},
	{errdefs.ErrResourceExhausted, "resource_exhausted", http.StatusTooManyRequests},
	{errdefs.ErrNotImplemented, "not_implemented", http.StatusNotImplemented},
	{errdefs.ErrUnavailable, "unavailable", http.StatusServiceUnavailable},
}

func writeErr(w http.ResponseWriter, err error) {
	code, status := "internal", http.StatusInternalServerError
	for _, c := range codes {
		if errors.Is(err, c.class) {
			code, status = c.code, c.status
			break
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error(), "code": code})
}
