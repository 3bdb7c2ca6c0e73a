package image

import (
	"context"
	"fmt"

	"github.com/dsec-dev/dsec/internal/blob"
)

// CommitDir commits an overlayfs upper directory as a new layer on top of
// base and tags the result newRef: a new image version sharing every base
// layer. The upper is taken as is, being already in overlay form:
// whiteouts (0/0 char devices) and opaque directories
// (trusted.overlay.opaque=y) are kept; overlay's bookkeeping xattrs are
// dropped and redirect/metacopy uppers are refused (see dirlayer.go). The
// caller must keep the upper still (freeze the sandbox) meanwhile.
func (s *Store) CommitDir(ctx context.Context, base, upperDir, newRef string, opts ...ImportOpt) (*Image, error) {
	newRef, err := NormalizeRef(newRef)
	if err != nil {
		return nil, err
	}
	var cfg importConfig
	for _, o := range opts {
		o(&cfg)
	}
	s.gcMu.RLock()
	defer s.gcMu.RUnlock()
	b, err := s.Resolve(ctx, base)
	if err != nil {
		return nil, fmt.Errorf("commit: base: %w", err)
	}
	pt := newProgress(cfg.progress, 1)
	pt.layer(1)
	d, ix, err := s.buildDir(ctx, upperDir, pt.add)
	if err != nil {
		return nil, fmt.Errorf("commit %s: %w", upperDir, err)
	}
	m := &Manifest{
		Parent: b.Digest,
		Config: b.Manifest.Config,
		Source: "commit on " + b.Ref,
		Layers: append(append([]LayerRef(nil), b.Manifest.Layers...), LayerRef{Digest: d, Size: ix.Size}),
	}
	owner, public := b.Owner, b.Public
	if cfg.owner != "" {
		owner, public = cfg.owner, cfg.public
	}
	im, err := s.writeImage(ctx, newRef, m, tagOpts{owner: owner, public: public})
	if err == nil {
		pt.done()
	}
	return im, err
}

// BuildLayer stores the directory dir as a layer (in overlay form: 0/0
// char devices are whiteouts, trusted.overlay.opaque=y dirs are opaque)
// without tagging anything, and returns its digest and index. Use
// WithLayers to make it part of an image version.
func (s *Store) BuildLayer(ctx context.Context, dir string) (blob.Digest, *Index, error) {
	s.gcMu.RLock()
	defer s.gcMu.RUnlock()
	return s.buildDir(ctx, dir, nil)
}

func (s *Store) buildDir(ctx context.Context, dir string, progress func(int64)) (blob.Digest, *Index, error) {
	b := newBuilder(ctx, s.blobs, s.buildConfig(progress))
	defer b.close()
	if err := b.addDir(dir, true); err != nil {
		return "", nil, err
	}
	ix, err := b.finish()
	if err != nil {
		return "", nil, err
	}
	d, err := putIndex(ctx, s.blobs, ix)
	if err != nil {
		return "", nil, err
	}
	return d, ix, nil
}

// BuildLayer stores dir as a layer in w with default settings (see
// Store.BuildLayer); for tests and tools that have no Store.
func BuildLayer(ctx context.Context, w blob.Writer, dir string) (blob.Digest, *Index, error) {
	b := newBuilder(ctx, w, buildConfig{compress: true})
	defer b.close()
	if err := b.addDir(dir, true); err != nil {
		return "", nil, err
	}
	ix, err := b.finish()
	if err != nil {
		return "", nil, err
	}
	d, err := putIndex(ctx, w, ix)
	if err != nil {
		return "", nil, err
	}
	return d, ix, nil
}
