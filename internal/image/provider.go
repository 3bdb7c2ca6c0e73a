package image

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/dsec-dev/dsec/internal/blob"
)

// LayerProvider makes a layer available as a directory usable as an
// overlay lowerdir. Acquire is reference counted: one directory per layer
// per node, shared by every sandbox using it; release drops the reference
// (call it once; later calls are no-ops). The unpacking provider below and
// lazyfs's FUSE mounter both implement it.
type LayerProvider interface {
	Acquire(ctx context.Context, layer blob.Digest) (path string, release func(), err error)
}

// UnpackProvider materialises layers with Unpack under root/<hex>. A
// finished directory is only ever installed by rename, so one found on
// disk (from an earlier run of the agent) is complete and reused.
type UnpackProvider struct {
	root string
	r    blob.Reader
	log  *slog.Logger

	mu     sync.Mutex
	layers map[blob.Digest]*unpacked
}

type unpacked struct {
	refs  int
	ready chan struct{} // closed when err/path are set
	err   error
}

var _ LayerProvider = (*UnpackProvider)(nil)

// NewUnpackProvider keeps unpacked layers under root (created 0700: layers
// hold setuid binaries and device nodes).
func NewUnpackProvider(root string, r blob.Reader, log *slog.Logger) (*UnpackProvider, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(filepath.Join(root, ".tmp"), 0o700); err != nil {
		return nil, fmt.Errorf("unpack provider: %w", err)
	}
	// Leftovers of unpacks interrupted by a crash.
	if ents, err := os.ReadDir(filepath.Join(root, ".tmp")); err == nil {
		for _, e := range ents {
			os.RemoveAll(filepath.Join(root, ".tmp", e.Name()))
		}
	}
	return &UnpackProvider{root: root, r: r, log: log, layers: map[blob.Digest]*unpacked{}}, nil
}

func (p *UnpackProvider) dir(layer blob.Digest) string { return filepath.Join(p.root, layer.Hex()) }

// Acquire implements LayerProvider.
func (p *UnpackProvider) Acquire(ctx context.Context, layer blob.Digest) (string, func(), error) {
	if err := layer.Validate(); err != nil {
		return "", nil, err
	}
	p.mu.Lock()
	u, ok := p.layers[layer]
	if !ok {
		u = &unpacked{ready: make(chan struct{})}
		p.layers[layer] = u
		go p.unpack(layer, u)
	}
	u.refs++
	p.mu.Unlock()

	var once sync.Once
	release := func() {
		once.Do(func() {
			p.mu.Lock()
			u.refs--
			p.mu.Unlock()
		})
	}
	select {
	case <-u.ready:
	case <-ctx.Done():
		release()
		return "", nil, ctx.Err()
	}
	if u.err != nil {
		release()
		return "", nil, u.err
	}
	return p.dir(layer), release, nil
}

// unpack runs detached from any one caller's context so that a caller
// giving up does not fail the others waiting for the same layer.
func (p *UnpackProvider) unpack(layer blob.Digest, u *unpacked) {
	defer close(u.ready)
	final := p.dir(layer)
	if _, err := os.Lstat(final); err == nil {
		return
	}
	tmp, err := os.MkdirTemp(filepath.Join(p.root, ".tmp"), layer.Hex()[:12]+"-")
	if err == nil {
		target := filepath.Join(tmp, "layer")
		if err = Unpack(context.Background(), p.r, layer, target); err == nil {
			err = os.Rename(target, final)
		}
		os.RemoveAll(tmp)
	}
	if err != nil {
		p.log.Error("unpacking layer failed", "layer", layer, "err", err)
		u.err = fmt.Errorf("layer %s: %w", layer, err)
		p.mu.Lock()
		delete(p.layers, layer) // the next Acquire retries
		p.mu.Unlock()
		return
	}
	p.log.Info("unpacked layer", "layer", layer, "dir", final)
}

// Prune removes unpacked layers no caller holds, including ones left by an
// earlier run (re-Acquire layers of adopted sandboxes before pruning). It
// returns how many it removed.
func (p *UnpackProvider) Prune(ctx context.Context) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ents, err := os.ReadDir(p.root)
	if err != nil {
		return 0, fmt.Errorf("prune: %w", err)
	}
	n := 0
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		d := blob.Digest("sha256:" + e.Name())
		if d.Validate() != nil {
			continue
		}
		if u, ok := p.layers[d]; ok && u.refs > 0 {
			continue
		}
		if u, ok := p.layers[d]; ok {
			select {
			case <-u.ready:
			default:
				continue // being unpacked
			}
		}
		if err := os.RemoveAll(filepath.Join(p.root, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return n, fmt.Errorf("prune: %w", err)
		}
		delete(p.layers, d)
		n++
	}
	return n, nil
}
