package lazyfs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image"
)

// PrefetchLists keeps the start-up read list of each layer. Load returns an
// error wrapping errdefs.ErrNotFound when a layer has none yet.
type PrefetchLists interface {
	Load(ctx context.Context, layer blob.Digest) ([]string, error)
	Save(ctx context.Context, layer blob.Digest, paths []string) error
}

// DirPrefetchLists stores lists as small JSON files in a node directory.
type DirPrefetchLists struct{ Dir string }

type prefetchFile struct {
	Layer blob.Digest `json:"layer"`
	Paths []string    `json:"paths"`
}

func (d DirPrefetchLists) file(layer blob.Digest) (string, error) {
	h := digestHex(layer)
	if h == "" {
		return "", fmt.Errorf("layer digest %q: %w", layer, errdefs.ErrInvalidArgument)
	}
	return filepath.Join(d.Dir, h+".json"), nil
}

// Load implements PrefetchLists.
func (d DirPrefetchLists) Load(ctx context.Context, layer blob.Digest) ([]string, error) {
	p, err := d.file(layer)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("prefetch list of %s: %w", layer, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	var f prefetchFile
	if err := json.Unmarshal(b, &f); err != nil || f.Layer != layer {
		return nil, fmt.Errorf("prefetch list %s is malformed: %w", p, errdefs.ErrInvalidArgument)
	}
	return f.Paths, nil
}

// Save implements PrefetchLists; it replaces the file atomically.
func (d DirPrefetchLists) Save(ctx context.Context, layer blob.Digest, paths []string) error {
	p, err := d.file(layer)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(d.Dir, 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(prefetchFile{Layer: layer, Paths: paths})
	if err != nil {
		return err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// recorder collects the paths a mount reads during its first window, in
// first-read order. A nil recorder records nothing.
type recorder struct {
	window time.Duration
	save   func(paths []string)
	off    atomic.Bool // set once the window closed; keeps the read path cheap

	mu    sync.Mutex
	seen  map[string]bool
	paths []string
	timer *time.Timer
	saved bool
}

func newRecorder(window time.Duration, save func([]string)) *recorder {
	return &recorder{window: window, save: save, seen: map[string]bool{}}
}

func (r *recorder) record(p string) {
	if r == nil || r.off.Load() {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.saved || r.seen[p] {
		return
	}
	if r.timer == nil {
		// The window starts at the mount's first use, not at mount time.
		r.timer = time.AfterFunc(r.window, r.flush)
	}
	r.seen[p] = true
	r.paths = append(r.paths, p)
}

// flush saves what was recorded, once; unmount calls it early.
func (r *recorder) flush() {
	if r == nil {
		return
	}
	r.off.Store(true)
	r.mu.Lock()
	if r.saved || len(r.paths) == 0 {
		r.saved = true
		r.mu.Unlock()
		return
	}
	r.saved = true
	if r.timer != nil {
		r.timer.Stop()
	}
	paths := r.paths
	r.mu.Unlock()
	r.save(paths)
}

// prefetch fetches the chunks of the listed files in list order with at
// most conc fetches in flight; it stops when ctx ends.
func prefetch(ctx context.Context, l *layerFS, paths []string, conc int) (files int, err error) {
	byPath := make(map[string]*image.Entry, len(l.idx.Entries))
	for i := range l.idx.Entries {
		byPath[l.idx.Entries[i].Path] = &l.idx.Entries[i]
	}
	sem := make(chan struct{}, max(conc, 1))
	var wg sync.WaitGroup
	var errMu sync.Mutex
	r := l.reader()
	for _, p := range paths {
		e := byPath[p]
		if e != nil && e.Type == image.TypeHardlink {
			e = byPath[e.Linkname]
		}
		if e == nil || e.Type != image.TypeReg {
			continue
		}
		files++
		for _, ch := range e.Chunks {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				wg.Wait()
				return files, ctx.Err()
			}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				if perr := l.cache.prefetch(ctx, l.src, ch, r); perr != nil {
					errMu.Lock()
					err = errors.Join(err, perr)
					errMu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	return files, err
}
