package main

// Adapters that plug the mechanism packages into the roles the node agent
// and the control plane consume. They hold no logic of their own beyond
// translating types, except the layer leases' use count.

import (
	"context"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/api"
	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/image"
	"github.com/dsec-dev/dsec/internal/layerd"
	"github.com/dsec-dev/dsec/internal/netpolicy"
	"github.com/dsec-dev/dsec/internal/node"
)

// layerLeases is node.LayerProvider over the layer daemon. The daemon
// holds one lease per layer for this server (holder "layer:DIGEST"), taken
// by the first sandbox that uses the layer and dropped with the last one;
// which sandboxes use a layer is counted here. A create whose layers are
// in use already makes no round trip to the daemon, nor does a delete
// that leaves them in use.
type layerLeases struct {
	c *layerd.Client

	// syncing: Sync runs alone (held exclusively), so that the leases it
	// keeps are exactly those in use; acquires and releases share it.
	syncing sync.RWMutex
	mu      sync.Mutex
	layers  map[string]*layerLease
}

// layerLease is this server's lease on one layer.
type layerLease struct {
	// mu orders the daemon calls of this layer: a release in flight
	// must not overtake an acquire made after it.
	mu      sync.Mutex
	path    string // "" while the daemon holds no lease for us
	holders map[string]bool
	gone    bool // dropped from layers; look the layer up again
}

func newLayerLeases(c *layerd.Client) *layerLeases {
	return &layerLeases{c: c, layers: map[string]*layerLease{}}
}

// leaseHolder names this server's lease on layer at the daemon.
func leaseHolder(layer string) string { return "layer:" + layer }

// lease returns layer's entry, locked and live.
func (l *layerLeases) lease(layer string, create bool) *layerLease {
	for {
		l.mu.Lock()
		e := l.layers[layer]
		if e == nil && create {
			e = &layerLease{holders: map[string]bool{}}
			l.layers[layer] = e
		}
		l.mu.Unlock()
		if e == nil {
			return nil
		}
		e.mu.Lock()
		if !e.gone {
			return e
		}
		e.mu.Unlock()
	}
}

// dropIfUnused forgets e when nothing holds it. e.mu held.
func (l *layerLeases) dropIfUnused(layer string, e *layerLease) {
	if len(e.holders) > 0 || e.path != "" {
		return
	}
	e.gone = true
	l.mu.Lock()
	delete(l.layers, layer)
	l.mu.Unlock()
}

func (l *layerLeases) Acquire(ctx context.Context, layer, holder string) (string, error) {
	l.syncing.RLock()
	defer l.syncing.RUnlock()
	e := l.lease(layer, true)
	defer e.mu.Unlock()
	if e.path == "" {
		path, err := l.c.Acquire(ctx, blob.Digest(layer), leaseHolder(layer))
		if err != nil {
			l.dropIfUnused(layer, e)
			return "", err
		}
		e.path = path
	}
	e.holders[holder] = true
	return e.path, nil
}

func (l *layerLeases) Release(ctx context.Context, layer, holder string) error {
	l.syncing.RLock()
	defer l.syncing.RUnlock()
	e := l.lease(layer, false)
	if e == nil {
		return nil
	}
	defer e.mu.Unlock()
	delete(e.holders, holder)
	if len(e.holders) > 0 || e.path == "" {
		return nil
	}
	// Forgotten even if the daemon cannot be told: the next acquire asks
	// it again, and Sync drops what it still holds.
	e.path = ""
	err := l.c.Release(ctx, blob.Digest(layer), leaseHolder(layer))
	l.dropIfUnused(layer, e)
	return err
}

// Sync forgets the holders not in live and has the daemon drop every lease
// but this server's leases on the layers still in use: those of sandboxes
// that ended while no server ran, and an earlier server's per-sandbox ones.
func (l *layerLeases) Sync(ctx context.Context, live []string) error {
	l.syncing.Lock()
	defer l.syncing.Unlock()
	keep := make(map[string]bool, len(live))
	for _, h := range live {
		keep[h] = true
	}
	l.mu.Lock()
	layers := make([]string, 0, len(l.layers))
	for layer := range l.layers {
		layers = append(layers, layer)
	}
	l.mu.Unlock()
	var held []string
	for _, layer := range layers {
		e := l.lease(layer, false)
		if e == nil {
			continue
		}
		for h := range e.holders {
			if !keep[h] {
				delete(e.holders, h)
			}
		}
		if len(e.holders) > 0 {
			held = append(held, leaseHolder(layer))
		} else {
			e.path = "" // dropped by the daemon's sync below
			l.dropIfUnused(layer, e)
		}
		e.mu.Unlock()
	}
	_, err := l.c.Sync(ctx, held)
	return err
}

// images adapts image.Store to the node's and the control plane's roles.
type images struct {
	st     *image.Store
	layerd *layerd.Client
	// inUse lists the pinned image versions live sandboxes run on (GC
	// keeps them). On a shared blob store it must cover every node.
	inUse func(ctx context.Context) []string
	// gcGrace: GC spares unreferenced blobs younger than this, which
	// imports on other nodes sharing the store may not have tagged yet.
	gcGrace time.Duration
}

// gcGrace is --gc-grace, or its default: a private store has no writer but
// this process, whose imports and commits GC already excludes, so nothing
// needs sparing; a --store may be shared with other nodes.
func gcGrace(o *serveOptions) time.Duration {
	switch {
	case o.gcGrace >= 0:
		return o.gcGrace
	case o.store == "":
		return 0
	}
	return image.DefaultGCGrace
}

var (
	_ node.ImageResolver  = (*images)(nil)
	_ node.LayerCommitter = (*images)(nil)
	_ api.ImageManager    = (*images)(nil)
	_ api.ImagePuller     = (*images)(nil)
)

func (im *images) ResolveImage(ctx context.Context, ref string) (string, []string, error) {
	img, err := im.st.Resolve(ctx, ref)
	if err != nil {
		return "", nil, err
	}
	ds := img.LayerDigests()
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = string(d)
	}
	return pinnedRef(img), out, nil
}

// pinnedRef names exactly this image version: NAME@sha256:....
func pinnedRef(img *image.Image) string {
	name, _, _ := strings.Cut(img.Ref, "@")
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name = name[:i]
	}
	return name + "@" + string(img.Digest)
}

func (im *images) CommitUpper(ctx context.Context, baseRef, upperDir, newRef string) (string, error) {
	img, err := im.st.CommitDir(ctx, baseRef, upperDir, newRef)
	if err != nil {
		return "", err
	}
	return img.Ref, nil
}

func imageInfo(img *image.Image) *api.ImageInfo {
	layers := make([]string, len(img.Manifest.Layers))
	for i, l := range img.Manifest.Layers {
		layers[i] = string(l.Digest)
	}
	return &api.ImageInfo{
		Name: img.Ref, Digest: string(img.Digest), Layers: layers, Size: img.Manifest.Size,
		Owner: img.Owner, Public: img.Public, CreatedAt: img.Manifest.Created,
	}
}

func progressOpt(fn func(api.ImportProgress)) image.ImportOpt {
	return image.WithProgress(func(p image.Progress) {
		if fn != nil {
			fn(api.ImportProgress{Layer: p.Layer, Layers: p.Layers, Bytes: p.Bytes, BytesPerSec: p.BytesPerSec, Done: p.Done})
		}
	})
}

func (im *images) ImportPath(ctx context.Context, ref, path string, progress func(api.ImportProgress)) (*api.ImageInfo, error) {
	img, err := im.st.Import(ctx, ref, path, progressOpt(progress))
	if err != nil {
		return nil, err
	}
	return imageInfo(img), nil
}

func (im *images) ImportTar(ctx context.Context, ref string, r io.Reader, progress func(api.ImportProgress)) (*api.ImageInfo, error) {
	img, err := im.st.ImportReader(ctx, ref, r, progressOpt(progress))
	if err != nil {
		return nil, err
	}
	return imageInfo(img), nil
}

// Pull implements api.ImagePuller. A registry on loopback speaks plain
// HTTP (go-containerregistry picks it for localhost and 127.0.0.0/8).
func (im *images) Pull(ctx context.Context, src, ref string, progress func(api.ImportProgress)) (*api.ImageInfo, error) {
	img, err := im.st.Pull(ctx, src, ref, progressOpt(progress))
	if err != nil {
		return nil, err
	}
	return imageInfo(img), nil
}

func (im *images) Resolve(ctx context.Context, ref string) (*api.ImageInfo, error) {
	img, err := im.st.Resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	return imageInfo(img), nil
}

func (im *images) List(ctx context.Context) ([]api.ImageInfo, error) {
	imgs, err := im.st.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.ImageInfo, len(imgs))
	for i := range imgs {
		out[i] = *imageInfo(&imgs[i])
	}
	return out, nil
}

func (im *images) Remove(ctx context.Context, ref string) error { return im.st.Remove(ctx, ref) }

func (im *images) GC(ctx context.Context) (*api.GCResult, error) {
	var keep []blob.Digest
	for _, ref := range im.inUse(ctx) {
		if img, err := im.st.Resolve(ctx, ref); err == nil {
			keep = append(keep, img.LayerDigests()...)
		}
	}
	res, err := im.st.GC(ctx, func() []blob.Digest { return keep }, image.WithGracePeriod(im.gcGrace))
	if err != nil {
		return nil, err
	}
	return &api.GCResult{RemovedBlobs: res.RemovedBlobs, FreedBytes: res.FreedBytes, KeptBlobs: res.KeptBlobs}, nil
}

func (im *images) Stats(ctx context.Context, ref string) (*api.ImageStats, error) {
	img, err := im.st.Resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	out := &api.ImageStats{Image: img.Ref, ImageBytes: img.Manifest.Size}
	if im.layerd == nil {
		return out, nil
	}
	// The daemon learns which layers make up the image here, where the
	// figures are read, not on every create.
	_ = im.layerd.SetImage(ctx, img.Ref, img.LayerDigests())
	st, err := im.layerd.ImageStats(ctx, img.Ref)
	if err != nil {
		// Unpacked layers keep no lazy-loading figures: the image is whole.
		return out, nil
	}
	out.FetchedBytes, out.ReadBytes = st.FetchedBytes, st.ReadBytes
	out.TransferredBytes, out.MetadataRequests = st.TransferredBytes, st.MetadataRequests
	out.CacheHits, out.CacheMisses, out.FetchWaitSecs = st.CacheHits, st.CacheMisses, st.FetchWaitSecs
	if n := st.CacheHits + st.CacheMisses; n > 0 {
		out.HitRatio = float64(st.CacheHits) / float64(n)
	}
	return out, nil
}

// network is node.Network over netpolicy, joining the sandbox's netns by pid.
type network struct{ m *netpolicy.Manager }

func (n network) Attach(ctx context.Context, id string, pid int, p node.NetworkPolicy) error {
	return n.m.Attach(ctx, id, "/proc/"+strconv.Itoa(pid)+"/ns/net", p)
}

func (n network) Update(ctx context.Context, id string, p node.NetworkPolicy) error {
	return n.m.Update(ctx, id, p)
}

func (n network) Detach(ctx context.Context, id string) error { return n.m.Detach(ctx, id) }
