package image

import (
	"context"
	"fmt"
	"time"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// DefaultGCGrace is how old an unreferenced blob must be before GC removes
// it. It protects imports and commits running in other processes or on
// other nodes sharing the blob store: they write chunks before the tag
// that references them, and re-Put (refreshing ModTime of) chunks they
// reuse. So it must exceed the longest import plus the S3 store's
// RefreshAge (10 min by default). Within one process GC and writers also
// exclude each other, so WithGracePeriod(0) is safe on a private store.
const DefaultGCGrace = time.Hour

// GCResult reports what a GC did.
type GCResult struct {
	RemovedBlobs int
	FreedBytes   int64
	KeptBlobs    int
}

type gcConfig struct {
	grace  time.Duration
	dryRun bool
}

// GCOpt configures GC.
type GCOpt func(*gcConfig)

// WithGracePeriod overrides DefaultGCGrace (0: collect regardless of age,
// safe only when no other process writes to the blob store).
func WithGracePeriod(d time.Duration) GCOpt { return func(c *gcConfig) { c.grace = d } }

// WithDryRun counts what would be removed without removing it.
func WithDryRun() GCOpt { return func(c *gcConfig) { c.dryRun = true } }

// GC removes blobs that no tagged image version and nothing in use
// references. inUse (may be nil) returns digests the caller's sandboxes
// and snapshots use, cluster-wide when the blob store is shared: image
// manifests, layer indexes or chunks; manifests and layers are expanded to
// everything they reference. Marking errors abort the GC before anything
// is removed: a blob is only deleted when it is certainly unreferenced.
func (s *Store) GC(ctx context.Context, inUse func() []blob.Digest, opts ...GCOpt) (GCResult, error) {
	cfg := gcConfig{grace: DefaultGCGrace}
	for _, o := range opts {
		o(&cfg)
	}
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	start := time.Now()

	marked := map[blob.Digest]bool{}
	layers := map[blob.Digest]bool{}
	markLayer := func(d blob.Digest) error {
		marked[d] = true
		if layers[d] {
			return nil
		}
		ix, err := ReadIndex(ctx, s.blobs, d)
		if err != nil {
			return err
		}
		layers[d] = true
		for _, e := range ix.Entries {
			for _, c := range e.Chunks {
				marked[c.Blob()] = true
			}
		}
		return nil
	}
	markManifest := func(d blob.Digest) error {
		marked[d] = true
		m, err := ReadManifest(ctx, s.blobs, d)
		if err != nil {
			return err
		}
		for _, l := range m.Layers {
			if err := markLayer(l.Digest); err != nil {
				return fmt.Errorf("layer %s: %w", l.Digest, err)
			}
		}
		return nil
	}

	recs, err := s.meta.ListRefs(ctx)
	if err != nil {
		return GCResult{}, fmt.Errorf("gc: %w", err)
	}
	for _, r := range recs {
		if err := markManifest(r.Manifest); err != nil {
			if errdefs.IsNotFound(err) {
				// Already broken; nothing of it can be served, and what
				// it referenced cannot be known.
				s.log.Warn("gc: image references a missing blob", "ref", r.Ref, "err", err)
				continue
			}
			return GCResult{}, fmt.Errorf("gc: image %s: %w", r.Ref, err)
		}
	}
	if inUse != nil {
		for _, d := range inUse() {
			if d.Validate() != nil {
				continue
			}
			marked[d] = true
			// What kind of blob it is is found by trying: anything that
			// decodes as a manifest or a layer index is expanded.
			if err := markManifest(d); err == nil {
				continue
			}
			if !layers[d] {
				_ = markLayer(d) // an error means not a layer: a chunk, or missing
			}
		}
	}

	var res GCResult
	err = s.blobs.Walk(ctx, func(i blob.Info) error {
		if marked[i.Digest] || (cfg.grace > 0 && start.Sub(i.ModTime) < cfg.grace) {
			res.KeptBlobs++
			return nil
		}
		if !cfg.dryRun {
			if err := s.blobs.Delete(ctx, i.Digest); err != nil && !errdefs.IsNotFound(err) {
				return err
			}
		}
		res.RemovedBlobs++
		res.FreedBytes += i.Size
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("gc: %w", err)
	}
	s.log.Info("gc done", "removed", res.RemovedBlobs, "freed", res.FreedBytes, "kept", res.KeptBlobs, "dry_run", cfg.dryRun)
	return res, nil
}

// LayerStats describes one layer.
type LayerStats struct {
	Digest      blob.Digest
	Size        int64 // file bytes (apparent)
	Entries     int
	Chunks      int   // distinct chunks
	StoredBytes int64 // index blob + distinct chunk blobs as stored
}

// ImageStats describes one image version.
type ImageStats struct {
	Ref         string
	Digest      blob.Digest
	Size        int64 // sum of layer sizes
	StoredBytes int64 // distinct blobs of all layers (shared ones once)
	Layers      []LayerStats
}

// Stats computes sizes from the layer indexes (no chunk is read).
func (s *Store) Stats(ctx context.Context, ref string) (*ImageStats, error) {
	im, err := s.Resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	st := &ImageStats{Ref: im.Ref, Digest: im.Digest}
	all := map[blob.Digest]bool{}
	for _, l := range im.Manifest.Layers {
		ix, err := ReadIndex(ctx, s.blobs, l.Digest)
		if err != nil {
			return nil, err
		}
		info, err := s.blobs.Stat(ctx, l.Digest)
		if err != nil {
			return nil, err
		}
		ls := LayerStats{Digest: l.Digest, Size: ix.Size, Entries: len(ix.Entries), StoredBytes: info.Size}
		if !all[l.Digest] {
			all[l.Digest] = true
			st.StoredBytes += info.Size
		}
		seen := map[blob.Digest]bool{}
		for _, e := range ix.Entries {
			for _, c := range e.Chunks {
				b := c.Blob()
				if !seen[b] {
					seen[b] = true
					ls.Chunks++
					ls.StoredBytes += c.BlobSize()
				}
				if !all[b] {
					all[b] = true
					st.StoredBytes += c.BlobSize()
				}
			}
		}
		st.Size += ix.Size
		st.Layers = append(st.Layers, ls)
	}
	return st, nil
}
