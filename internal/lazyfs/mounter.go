package lazyfs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image"
)

// Defaults; see the options.
const (
	DefaultGracePeriod         = time.Minute
	DefaultPrefetchWindow      = 10 * time.Second
	DefaultPrefetchConcurrency = 4
	// maxRead is the largest FUSE read the kernel sends.
	maxRead = 1 << 20
	// cacheTimeout is how long the kernel may cache entries, attributes and
	// negative lookups: a layer never changes.
	cacheTimeout = 24 * time.Hour
)

// Mounter mounts layers, one shared FUSE mount per layer on the node.
type Mounter struct {
	root     string
	src      blob.Reader
	cache    *ChunkCache
	log      *slog.Logger
	grace    time.Duration
	window   time.Duration
	conc     int
	lists    PrefetchLists
	pthrough bool
	debug    bool

	mu         sync.Mutex
	closed     bool
	mounts     map[blob.Digest]*mount
	leaving    map[blob.Digest]chan struct{} // unmounts in progress
	layerStats map[blob.Digest]*layerStats
	images     map[string][]blob.Digest
	bg         sync.WaitGroup
}

type mount struct {
	digest blob.Digest
	dir    string
	ready  chan struct{}
	err    error
	refs   int
	timer  *time.Timer
	srv    *fuse.Server
	lfs    *layerFS
	stop   context.CancelFunc // stops prefetch
}

var _ image.LayerProvider = (*Mounter)(nil)

// Opt configures a Mounter.
type Opt func(*Mounter)

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Opt { return func(m *Mounter) { m.log = l } }

// WithGracePeriod sets how long a layer stays mounted after its last
// release (default DefaultGracePeriod); 0 unmounts in the release call.
func WithGracePeriod(d time.Duration) Opt { return func(m *Mounter) { m.grace = d } }

// WithPrefetchWindow sets how long after first use reads are recorded
// (default DefaultPrefetchWindow); a negative value disables recording.
func WithPrefetchWindow(d time.Duration) Opt { return func(m *Mounter) { m.window = d } }

// WithPrefetchConcurrency bounds concurrent prefetch fetches per layer.
func WithPrefetchConcurrency(n int) Opt { return func(m *Mounter) { m.conc = n } }

// WithPrefetchLists sets where prefetch lists live (default a
// DirPrefetchLists in root/.prefetch).
func WithPrefetchLists(p PrefetchLists) Opt { return func(m *Mounter) { m.lists = p } }

// WithPassthrough enables or disables FUSE passthrough (default on; the
// kernel silently falls back when it lacks support).
func WithPassthrough(on bool) Opt { return func(m *Mounter) { m.pthrough = on } }

// WithFUSEDebug logs every FUSE request.
func WithFUSEDebug(on bool) Opt { return func(m *Mounter) { m.debug = on } }

// NewMounter returns a Mounter that mounts layers read from src under root,
// caching chunks in cache.
func NewMounter(root string, src blob.Reader, cache *ChunkCache, opts ...Opt) (*Mounter, error) {
	if root == "" || src == nil || cache == nil {
		return nil, fmt.Errorf("lazyfs: root, store and cache are required: %w", errdefs.ErrInvalidArgument)
	}
	m := &Mounter{
		root: root, src: src, cache: cache, log: slog.Default(),
		grace: DefaultGracePeriod, window: DefaultPrefetchWindow, conc: DefaultPrefetchConcurrency,
		pthrough:   true,
		mounts:     map[blob.Digest]*mount{},
		leaving:    map[blob.Digest]chan struct{}{},
		layerStats: map[blob.Digest]*layerStats{},
		images:     map[string][]blob.Digest{},
	}
	for _, o := range opts {
		o(m)
	}
	if m.lists == nil {
		m.lists = DirPrefetchLists{Dir: filepath.Join(root, ".prefetch")}
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("lazyfs: create root: %w", err)
	}
	return m, nil
}

// Mountpoint is where the layer is (or would be) mounted. It has no ':' so
// it can be used in an overlayfs lowerdir list.
func (m *Mounter) Mountpoint(layer blob.Digest) string {
	return filepath.Join(m.root, digestHex(layer))
}

// Acquire mounts the layer if it is not mounted yet and returns its
// mountpoint and a release func (idempotent). Concurrent Acquires of one
// layer share one mount.
func (m *Mounter) Acquire(ctx context.Context, layer blob.Digest) (string, func(), error) {
	if digestHex(layer) == "" {
		return "", nil, fmt.Errorf("layer digest %q: %w", layer, errdefs.ErrInvalidArgument)
	}
	for {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return "", nil, fmt.Errorf("lazyfs: mounter closed: %w", errdefs.ErrFailedPrecondition)
		}
		if gone, ok := m.leaving[layer]; ok {
			m.mu.Unlock()
			select {
			case <-gone:
				continue
			case <-ctx.Done():
				return "", nil, ctx.Err()
			}
		}
		mt := m.mounts[layer]
		creator := mt == nil
		if creator {
			mt = &mount{digest: layer, dir: m.Mountpoint(layer), ready: make(chan struct{})}
			m.mounts[layer] = mt
		}
		mt.refs++
		if mt.timer != nil {
			mt.timer.Stop()
			mt.timer = nil
		}
		m.mu.Unlock()

		if creator {
			mt.err = m.mount(ctx, mt)
			close(mt.ready)
		}
		var once sync.Once
		release := func() { once.Do(func() { m.release(mt) }) }
		select {
		case <-mt.ready:
		case <-ctx.Done():
			release()
			return "", nil, ctx.Err()
		}
		if mt.err != nil {
			release()
			return "", nil, mt.err
		}
		return mt.dir, release, nil
	}
}

func (m *Mounter) release(mt *mount) {
	m.mu.Lock()
	mt.refs--
	if mt.refs > 0 || m.mounts[mt.digest] != mt {
		m.mu.Unlock()
		return
	}
	if mt.err != nil {
		delete(m.mounts, mt.digest)
		m.mu.Unlock()
		return
	}
	if m.grace > 0 {
		mt.timer = time.AfterFunc(m.grace, func() { m.expire(mt) })
		m.mu.Unlock()
		return
	}
	m.mu.Unlock()
	m.expire(mt)
}

// expire unmounts an unused mount unless it was acquired again meanwhile.
func (m *Mounter) expire(mt *mount) {
	m.mu.Lock()
	if mt.refs > 0 || m.mounts[mt.digest] != mt || m.closed {
		m.mu.Unlock()
		return
	}
	delete(m.mounts, mt.digest)
	gone := make(chan struct{})
	m.leaving[mt.digest] = gone
	m.mu.Unlock()

	err := m.unmount(mt, false)

	m.mu.Lock()
	delete(m.leaving, mt.digest)
	closed := m.closed
	if err != nil && !closed {
		// Still in use (e.g. an overlay on top): keep it for reuse and
		// let Close detach it.
		m.mounts[mt.digest] = mt
	}
	m.mu.Unlock()
	if err != nil && closed {
		// Close has already collected its mounts: detach this one here.
		err = m.unmount(mt, true)
	}
	close(gone)
	if err != nil {
		m.log.Error("lazyfs: unmount failed, keeping the layer mounted", "layer", mt.digest, "dir", mt.dir, "err", err)
	}
}

func (m *Mounter) mount(ctx context.Context, mt *mount) error {
	idx, err := loadIndex(ctx, m.src, mt.digest)
	if err != nil {
		return err
	}
	st := m.stats(mt.digest)
	st.imageBytes.Store(idx.Size)
	l := &layerFS{
		digest: mt.digest, idx: idx, src: m.src, cache: m.cache, st: st,
		log: m.log, passthrough: m.pthrough, noXattrs: !hasXattrs(idx),
	}
	var list []string
	if m.window >= 0 {
		list, err = m.lists.Load(ctx, mt.digest)
		if err != nil && !errdefs.IsNotFound(err) {
			m.log.Warn("lazyfs: cannot load prefetch list", "layer", mt.digest, "err", err)
		}
		if err != nil {
			// First mount of this layer on the node: record its start-up reads.
			l.rec = newRecorder(m.window, func(paths []string) {
				if err := m.lists.Save(context.Background(), mt.digest, paths); err != nil {
					m.log.Warn("lazyfs: cannot save prefetch list", "layer", mt.digest, "err", err)
				}
			})
		}
	}
	if err := os.MkdirAll(mt.dir, 0o755); err != nil {
		return fmt.Errorf("lazyfs: create mountpoint: %w", err)
	}
	// A mount left by a crashed daemon would shadow ours; detach it.
	_ = syscall.Unmount(mt.dir, syscall.MNT_DETACH)

	timeout := cacheTimeout
	opts := &fs.Options{
		MountOptions: fuse.MountOptions{
			AllowOther:   true,
			Options:      []string{"default_permissions", "ro"},
			FsName:       "dsec-layer",
			Name:         "dsec",
			MaxWrite:     maxRead, // go-fuse derives max_read and max_pages from it
			MaxReadAhead: maxRead,
			DirectMount:  true,
			// Passthrough backing files live on a plain disk fs; the
			// mount itself is stacked under overlayfs.
			MaxStackDepth: 1,
			// The kernel keeps symlink targets in its page cache: `ls -l`
			// reads every link, and none ever changes.
			EnableSymlinkCaching: true,
			Debug:                m.debug,
		},
		// Whiteouts have mode 0; serve modes exactly.
		NullPermissions: true,
		EntryTimeout:    &timeout,
		AttrTimeout:     &timeout,
		NegativeTimeout: &timeout,
		// Node ID = inode number, so that rawLayer finds a directory by
		// the node ID alone (READDIR without OPENDIR). The numbers are
		// stable and unique per layer (the entry's index).
		ExternalNodeID: true,
	}
	if !m.pthrough {
		opts.MountOptions.DisabledCapabilities = fuse.CAP_PASSTHROUGH
	}
	// fs.Mount, with rawLayer between the kernel and the node bridge.
	raw := &rawLayer{RawFileSystem: fs.NewNodeFS(l.root(), opts), l: l}
	srv, err := fuse.NewServer(raw, mt.dir, &opts.MountOptions)
	if err == nil {
		go srv.Serve()
		err = srv.WaitMount()
	}
	if err != nil {
		return fmt.Errorf("lazyfs: mount layer %s at %s: %w", mt.digest, mt.dir, err)
	}
	mt.srv, mt.lfs = srv, l
	pctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	mt.stop = stop
	if len(list) > 0 {
		m.bg.Add(1)
		go func() {
			defer m.bg.Done()
			start := time.Now()
			files, err := prefetch(pctx, l, list, m.conc)
			if err != nil && pctx.Err() == nil {
				m.log.Warn("lazyfs: prefetch incomplete", "layer", mt.digest, "err", err)
			}
			m.log.Debug("lazyfs: prefetched", "layer", mt.digest, "files", files, "took", time.Since(start))
		}()
	}
	return nil
}

// unmount stops prefetch, saves the recorded list and unmounts; detach
// forces a lazy unmount when the mount is busy.
//
// An overlay stacked on the layer holds a private clone of the mount, so
// the unmount succeeds while the overlay still reads through it: the
// daemon keeps serving until the kernel drops the connection, which is why
// this does not wait for the server to stop (go-fuse's Unmount would).
func (m *Mounter) unmount(mt *mount, detach bool) error {
	mt.stop()
	mt.lfs.rec.flush()
	var err error
	for try := 0; try < 3; try++ {
		// Right after the last close the kernel may still hold the files
		// for a moment.
		if err = syscall.Unmount(mt.dir, 0); err != syscall.EBUSY {
			break
		}
		time.Sleep(time.Duration(try+1) * 10 * time.Millisecond)
	}
	if err != nil && detach {
		err = syscall.Unmount(mt.dir, syscall.MNT_DETACH)
	}
	if err != nil {
		return fmt.Errorf("unmount %s: %w", mt.dir, err)
	}
	go mt.srv.Wait()
	if rerr := os.Remove(mt.dir); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		m.log.Warn("lazyfs: remove mountpoint", "dir", mt.dir, "err", rerr)
	}
	return nil
}

// Mounted lists the layers currently mounted.
func (m *Mounter) Mounted() []blob.Digest {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []blob.Digest
	for d, mt := range m.mounts {
		select {
		case <-mt.ready:
			if mt.err == nil {
				out = append(out, d)
			}
		default:
		}
	}
	return out
}

// Close unmounts every layer, detaching busy ones, and waits for background
// prefetches. Later Acquires fail.
func (m *Mounter) Close(ctx context.Context) error {
	m.mu.Lock()
	m.closed = true
	var all []*mount
	refs := map[*mount]int{}
	for _, mt := range m.mounts {
		if mt.timer != nil {
			mt.timer.Stop()
		}
		all = append(all, mt)
		refs[mt] = mt.refs
	}
	var leaving []chan struct{}
	for _, ch := range m.leaving {
		leaving = append(leaving, ch)
	}
	m.mu.Unlock()
	for _, ch := range leaving {
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var errs []error
	for _, mt := range all {
		select {
		case <-mt.ready:
		case <-ctx.Done():
			return ctx.Err()
		}
		if mt.err != nil {
			continue
		}
		if refs[mt] > 0 {
			m.log.Warn("lazyfs: unmounting a layer still acquired", "layer", mt.digest, "refs", refs[mt])
		}
		if err := m.unmount(mt, true); err != nil {
			errs = append(errs, err)
		}
	}
	m.mu.Lock()
	clear(m.mounts)
	m.mu.Unlock()
	done := make(chan struct{})
	go func() { m.bg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, ctx.Err())
	}
	return errors.Join(errs...)
}
