package lazyfs

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image"
)

// ErrCorrupt marks data whose digest does not match its name.
var ErrCorrupt = fmt.Errorf("corrupt data: %w", errdefs.ErrFailedPrecondition)

// maxChunkSize bounds what a chunk may claim to be, so a bad index cannot
// make the daemon allocate arbitrary memory.
const maxChunkSize = image.MaxChunkSize

// memSlots is how many uncached chunks are kept in memory when the disk
// cache is full, so sequential 1 MiB reads of one chunk fetch it once.
const memSlots = 8

// ChunkCache is a bounded on-disk cache of verified chunks, shared by all
// layers on a node. Entries are chunk files named by the digest of their
// uncompressed bytes (dir/chunks/<hex>) and whole-file copies assembled for
// passthrough (dir/files/<hex>). Unpinned entries are evicted in LRU order;
// an entry is pinned while a read uses it or a passthrough file is backed
// by it.
type ChunkCache struct {
	dir      string
	capacity int64
	log      *slog.Logger
	attempts int
	backoff  time.Duration
	timeout  time.Duration
	memo     time.Duration

	mu        sync.Mutex
	entries   map[string]*cacheEntry
	lru       list.List // of *cacheEntry, most recently used at the front
	used      int64
	inflight  map[blob.Digest]*fetchCall
	busy      sync.WaitGroup // fetches not yet stored
	failures  map[blob.Digest]failure
	mem       [memSlots]memChunk
	memNext   int
	evictions uint64
	uncached  uint64
}

type cacheEntry struct {
	name     string // "chunks/<hex>" or "files/<hex>"
	size     int64
	pins     int
	verified bool // false for entries found on disk at startup
	digest   blob.Digest
	elem     *list.Element
}

type memChunk struct {
	digest blob.Digest
	data   []byte
}

// failure remembers a failed fetch briefly: the kernel retries a failed
// page read at once, and many readers may hit one broken chunk; neither
// should multiply the retries against a store that is down.
type failure struct {
	err   error
	until time.Time
}

type fetchCall struct {
	done   chan struct{} // data or err is set
	stored chan struct{} // the chunk is in the cache (or could not be)
	data   []byte
	err    error
}

// CacheOpt configures a ChunkCache.
type CacheOpt func(*ChunkCache)

// WithCacheLogger sets the logger (default slog.Default()).
func WithCacheLogger(l *slog.Logger) CacheOpt { return func(c *ChunkCache) { c.log = l } }

// WithRetry sets how many times a store read is attempted and the first
// backoff, doubled after each failure (default 3 attempts, 100ms).
func WithRetry(attempts int, backoff time.Duration) CacheOpt {
	return func(c *ChunkCache) { c.attempts, c.backoff = attempts, backoff }
}

// WithFailureMemo sets how long a failed fetch is remembered and its error
// returned without asking the store again (default 1s).
func WithFailureMemo(d time.Duration) CacheOpt { return func(c *ChunkCache) { c.memo = d } }

// WithFetchTimeout bounds one attempt to fetch a chunk (default 30s).
func WithFetchTimeout(d time.Duration) CacheOpt { return func(c *ChunkCache) { c.timeout = d } }

// CacheStats describes the node cache.
type CacheStats struct {
	Capacity  int64
	Used      int64
	Entries   int
	Pinned    int
	Evictions uint64
	// Uncached counts fetched chunks that were served without being cached
	// because nothing could be evicted.
	Uncached uint64
}

// NewChunkCache opens (creating it if needed) a cache in dir holding at
// most capacity bytes. Chunks left by a previous run are kept and verified
// on first use; assembled files are dropped.
func NewChunkCache(dir string, capacity int64, opts ...CacheOpt) (*ChunkCache, error) {
	if capacity <= 0 {
		return nil, fmt.Errorf("chunk cache capacity %d: must be positive: %w", capacity, errdefs.ErrInvalidArgument)
	}
	c := &ChunkCache{
		dir: dir, capacity: capacity, log: slog.Default(),
		attempts: 3, backoff: 100 * time.Millisecond, timeout: 30 * time.Second, memo: time.Second,
		entries:  map[string]*cacheEntry{},
		failures: map[blob.Digest]failure{},
		inflight: map[blob.Digest]*fetchCall{},
	}
	for _, o := range opts {
		o(c)
	}
	if c.attempts < 1 {
		c.attempts = 1
	}
	for _, sub := range []string{"files", "tmp"} {
		if err := os.RemoveAll(filepath.Join(dir, sub)); err != nil {
			return nil, fmt.Errorf("reset chunk cache: %w", err)
		}
	}
	for _, sub := range []string{"chunks", "files", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("create chunk cache: %w", err)
		}
	}
	des, err := os.ReadDir(filepath.Join(dir, "chunks"))
	if err != nil {
		return nil, fmt.Errorf("scan chunk cache: %w", err)
	}
	for _, de := range des {
		fi, err := de.Info()
		if err != nil || !fi.Mode().IsRegular() || !isHex64(de.Name()) {
			continue
		}
		name := "chunks/" + de.Name()
		c.unsafeAdd(&cacheEntry{name: name, size: fi.Size(), digest: blob.Digest("sha256:" + de.Name())})
	}
	c.mu.Lock()
	c.unsafeEvict(0)
	c.mu.Unlock()
	return c, nil
}

// Stats returns a snapshot of the cache's counters.
func (c *ChunkCache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := CacheStats{Capacity: c.capacity, Used: c.used, Entries: len(c.entries), Evictions: c.evictions, Uncached: c.uncached}
	for _, e := range c.entries {
		if e.pins > 0 {
			s.Pinned++
		}
	}
	return s
}

// Contains reports whether the chunk is cached on disk.
func (c *ChunkCache) Contains(d blob.Digest) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.entries[chunkName(d)]
	return ok
}

func isHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, r := range s {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
}

// digestHex returns the hex of a sha256 digest, or "" if d is malformed.
func digestHex(d blob.Digest) string {
	h, ok := strings.CutPrefix(string(d), "sha256:")
	if !ok || !isHex64(h) {
		return ""
	}
	return h
}

func chunkName(d blob.Digest) string { return "chunks/" + digestHex(d) }

func (c *ChunkCache) path(name string) string { return filepath.Join(c.dir, name) }

func (c *ChunkCache) unsafeAdd(e *cacheEntry) {
	e.elem = c.lru.PushFront(e)
	c.entries[e.name] = e
	c.used += e.size
}

func (c *ChunkCache) unsafeRemove(e *cacheEntry) {
	c.lru.Remove(e.elem)
	delete(c.entries, e.name)
	c.used -= e.size
	// Readers holding the file open keep reading it: unlink is safe.
	if err := os.Remove(c.path(e.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		c.log.Warn("lazyfs: remove cache entry", "entry", e.name, "err", err)
	}
}

// unsafeEvict evicts unpinned entries, least recently used first, until
// need more bytes fit. It reports whether they do.
func (c *ChunkCache) unsafeEvict(need int64) bool {
	for el := c.lru.Back(); el != nil && c.used+need > c.capacity; {
		e := el.Value.(*cacheEntry)
		el = el.Prev()
		if e.pins > 0 {
			continue
		}
		c.unsafeRemove(e)
		c.evictions++
	}
	return c.used+need <= c.capacity
}

// pin returns the entry pinned and marked recently used, or nil.
func (c *ChunkCache) pin(name string) *cacheEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[name]
	if e == nil {
		return nil
	}
	e.pins++
	c.lru.MoveToFront(e.elem)
	return e
}

func (c *ChunkCache) unpin(e *cacheEntry) {
	c.mu.Lock()
	e.pins--
	c.mu.Unlock()
}

// drop removes a cached entry found to be bad.
func (c *ChunkCache) drop(e *cacheEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries[e.name] == e {
		c.unsafeRemove(e)
	}
}

// verifyEntry checks an entry loaded from disk once before it is trusted.
func (c *ChunkCache) verifyEntry(f *os.File, e *cacheEntry) error {
	c.mu.Lock()
	ok := e.verified
	c.mu.Unlock()
	if ok {
		return nil
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, e.size)); err != nil {
		return err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); blob.Digest(got) != e.digest {
		return fmt.Errorf("cached chunk %s has digest %s: %w", e.digest, got, ErrCorrupt)
	}
	c.mu.Lock()
	e.verified = true
	c.mu.Unlock()
	return nil
}

// reader identifies who reads a chunk, for stats and logs.
type reader struct {
	layer blob.Digest
	st    *layerStats
}

// ReadChunk copies the chunk's uncompressed bytes from off into p, fetching
// and caching the chunk on a miss. It returns len(p) bytes or an error.
func (c *ChunkCache) ReadChunk(ctx context.Context, src blob.Reader, ch image.Chunk, p []byte, off int64) error {
	return c.readChunk(ctx, src, ch, p, off, reader{})
}

func (c *ChunkCache) readChunk(ctx context.Context, src blob.Reader, ch image.Chunk, p []byte, off int64, r reader) error {
	if digestHex(ch.Digest) == "" || ch.Size < 0 || ch.Size > maxChunkSize {
		return fmt.Errorf("chunk %q size %d: %w", ch.Digest, ch.Size, errdefs.ErrInvalidArgument)
	}
	if off < 0 || off+int64(len(p)) > ch.Size {
		return fmt.Errorf("read [%d,+%d) past chunk %s of %d bytes: %w", off, len(p), ch.Digest, ch.Size, errdefs.ErrInvalidArgument)
	}
	hit, err := c.readCached(ch, p, off)
	if err != nil {
		c.log.Error("lazyfs: dropping bad cache entry", "chunk", ch.Digest, "layer", r.layer, "err", err)
	}
	if hit {
		r.st.hit()
		return nil
	}
	if c.readMem(ch.Digest, p, off) {
		r.st.hit()
		return nil
	}
	start := time.Now()
	data, err := c.fetch(ctx, src, ch, r, false)
	r.st.miss(time.Since(start))
	if err != nil {
		return err
	}
	copy(p, data[off:])
	return nil
}

// readCached serves p from the disk cache if the chunk is there.
func (c *ChunkCache) readCached(ch image.Chunk, p []byte, off int64) (bool, error) {
	e := c.pin(chunkName(ch.Digest))
	if e == nil {
		return false, nil
	}
	defer c.unpin(e)
	f, err := os.Open(c.path(e.name))
	if err != nil {
		c.drop(e)
		return false, err
	}
	defer f.Close()
	if e.size != ch.Size {
		c.drop(e)
		return false, fmt.Errorf("cached chunk %s is %d bytes, index says %d: %w", ch.Digest, e.size, ch.Size, ErrCorrupt)
	}
	if err := c.verifyEntry(f, e); err != nil {
		c.drop(e)
		return false, err
	}
	if _, err := f.ReadAt(p, off); err != nil {
		c.drop(e)
		return false, err
	}
	// The daemon's copy goes into the FUSE page cache; don't keep a second
	// one for the chunk file.
	_ = unix.Fadvise(int(f.Fd()), off, int64(len(p)), unix.FADV_DONTNEED)
	return true, nil
}

func (c *ChunkCache) readMem(d blob.Digest, p []byte, off int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.mem {
		if m.digest == d {
			copy(p, m.data[off:])
			return true
		}
	}
	return false
}

// Prefetch fetches the chunk into the cache unless it is there already.
func (c *ChunkCache) Prefetch(ctx context.Context, src blob.Reader, ch image.Chunk) error {
	return c.prefetch(ctx, src, ch, reader{})
}

func (c *ChunkCache) prefetch(ctx context.Context, src blob.Reader, ch image.Chunk, r reader) error {
	if digestHex(ch.Digest) == "" || ch.Size < 0 || ch.Size > maxChunkSize {
		return fmt.Errorf("chunk %q size %d: %w", ch.Digest, ch.Size, errdefs.ErrInvalidArgument)
	}
	if c.Contains(ch.Digest) {
		return nil
	}
	_, err := c.fetch(ctx, src, ch, r, true)
	return err
}

// fetch returns the chunk's verified bytes, sharing one fetch among all
// concurrent callers. The fetch itself is not bound to any one caller's
// context so an interrupted reader does not fail the others; it is bounded
// by the fetch timeout and retries.
func (c *ChunkCache) fetch(ctx context.Context, src blob.Reader, ch image.Chunk, r reader, prefetch bool) ([]byte, error) {
	c.mu.Lock()
	if f, ok := c.failures[ch.Digest]; ok {
		if time.Now().Before(f.until) {
			c.mu.Unlock()
			return nil, f.err
		}
		delete(c.failures, ch.Digest)
	}
	call, ok := c.inflight[ch.Digest]
	if !ok {
		call = &fetchCall{done: make(chan struct{}), stored: make(chan struct{})}
		c.inflight[ch.Digest] = call
		c.busy.Add(1)
		// Shared by all waiters: not tied to this caller's context (a FUSE
		// request's context is recycled by go-fuse once it is answered).
		go c.runFetch(context.Background(), src, ch, r, prefetch, call)
	}
	c.mu.Unlock()
	wait := call.done
	if prefetch {
		wait = call.stored
	}
	select {
	case <-wait:
		return call.data, call.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *ChunkCache) runFetch(ctx context.Context, src blob.Reader, ch image.Chunk, r reader, prefetch bool, call *fetchCall) {
	data, err := c.fetchRetry(ctx, src, ch, r)
	if err == nil {
		r.st.addFetched(int64(len(data)), ch.BlobSize(), prefetch)
		call.data = data
		// Readers go on with the bytes in memory; the call stays in flight
		// until the chunk is on disk so nobody fetches it again meanwhile.
		close(call.done)
		c.store(ch.Digest, data, r)
	}
	c.mu.Lock()
	delete(c.inflight, ch.Digest)
	if err != nil && c.memo > 0 {
		c.failures[ch.Digest] = failure{err: err, until: time.Now().Add(c.memo)}
	}
	c.mu.Unlock()
	if err != nil {
		call.err = err
		close(call.done)
	}
	close(call.stored)
	c.busy.Done()
}

// settle waits until every fetch started so far is stored (tests use it to
// make "fully cached" deterministic).
func (c *ChunkCache) settle() { c.busy.Wait() }

// fetchRetry fetches a chunk, retrying store errors with backoff; a corrupt
// chunk is not retried.
func (c *ChunkCache) fetchRetry(ctx context.Context, src blob.Reader, ch image.Chunk, r reader) ([]byte, error) {
	backoff := c.backoff
	for attempt := 1; ; attempt++ {
		data, err := c.fetchOnce(ctx, src, ch)
		if err == nil {
			return data, nil
		}
		if errors.Is(err, ErrCorrupt) {
			r.st.failed()
			c.log.Error("lazyfs: corrupt chunk in store", "chunk", ch.Digest, "stored", ch.Stored, "layer", r.layer, "err", err)
			return nil, err
		}
		if attempt >= c.attempts {
			r.st.failed()
			c.log.Error("lazyfs: chunk fetch failed", "chunk", ch.Digest, "layer", r.layer, "attempts", c.attempts, "err", err)
			return nil, fmt.Errorf("fetch chunk %s after %d attempts: %w: %w", ch.Digest, c.attempts, err, errdefs.ErrUnavailable)
		}
		c.log.Warn("lazyfs: chunk fetch failed, retrying", "chunk", ch.Digest, "layer", r.layer, "attempt", attempt, "err", err)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		backoff *= 2
	}
}

// fetchOnce reads and verifies one chunk (image.ReadChunk owns the blob
// format); the buffer has room for the compressed form too.
func (c *ChunkCache) fetchOnce(ctx context.Context, src blob.Reader, ch image.Chunk) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	data, err := image.ReadChunk(ctx, src, ch, make([]byte, 0, 2*ch.Size))
	if errors.Is(err, blob.ErrDigestMismatch) {
		err = fmt.Errorf("%w: %w", err, ErrCorrupt)
	}
	return data, err
}

// store caches verified bytes, or keeps them in memory when the cache is
// full of pinned entries or the disk refuses them.
func (c *ChunkCache) store(d blob.Digest, data []byte, r reader) {
	name := chunkName(d)
	size := int64(len(data))
	c.mu.Lock()
	if _, ok := c.entries[name]; ok {
		c.mu.Unlock()
		return
	}
	fits := c.unsafeEvict(size)
	if fits {
		// Reserve the space while writing outside the lock.
		c.used += size
	}
	c.mu.Unlock()
	if fits {
		err := c.writeFile(name, data)
		c.mu.Lock()
		c.used -= size
		if err == nil {
			if _, ok := c.entries[name]; !ok {
				c.unsafeAdd(&cacheEntry{name: name, size: size, verified: true, digest: d})
			}
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		c.log.Warn("lazyfs: cannot cache chunk, serving it uncached", "chunk", d, "layer", r.layer, "err", err)
	}
	c.mu.Lock()
	c.uncached++
	c.mem[c.memNext] = memChunk{digest: d, data: data}
	c.memNext = (c.memNext + 1) % memSlots
	c.mu.Unlock()
}

// writeFile writes data to a temp file and renames it into place so a
// crash never leaves a partial entry under a valid name.
func (c *ChunkCache) writeFile(name string, data []byte) error {
	f, err := os.CreateTemp(c.path("tmp"), "w-")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		// The reader's copy lives in the FUSE page cache: write the chunk
		// out and drop its pages so the node does not cache it twice.
		// Readers do not wait for this.
		err = unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
		_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), c.path(name))
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// backing is a pinned whole-file copy used as a passthrough backing file.
type backing struct {
	c *ChunkCache
	e *cacheEntry
	f *os.File
}

func (b *backing) Close() error {
	err := b.f.Close()
	b.c.unpin(b.e)
	return err
}

// openBacking returns a pinned file holding exactly the regular file made of
// chunks (holes read as zeros), or ok=false when some chunk is not cached or
// there is no room. It never fetches.
func (c *ChunkCache) openBacking(chunks []image.Chunk, size int64) (*backing, bool) {
	if size <= 0 || len(chunks) == 0 {
		return nil, false
	}
	if len(chunks) == 1 && chunks[0].Offset == 0 && chunks[0].Size == size {
		return c.openEntry(chunkName(chunks[0].Digest), chunks[0].Size)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%d\n", size)
	for _, ch := range chunks {
		fmt.Fprintf(h, "%s %d %d\n", ch.Digest, ch.Offset, ch.Size)
	}
	name := "files/" + hex.EncodeToString(h.Sum(nil))
	if b, ok := c.openEntry(name, size); ok {
		return b, true
	}
	return c.assemble(name, chunks, size)
}

func (c *ChunkCache) openEntry(name string, size int64) (*backing, bool) {
	e := c.pin(name)
	if e == nil {
		return nil, false
	}
	f, err := os.Open(c.path(name))
	if err == nil && e.size == size {
		if err = c.verifyEntry(f, e); err == nil {
			return &backing{c: c, e: e, f: f}, true
		}
	}
	if f != nil {
		f.Close()
	}
	c.unpin(e)
	c.drop(e)
	return nil, false
}

// assemble copies cached chunks into one sparse file.
func (c *ChunkCache) assemble(name string, chunks []image.Chunk, size int64) (*backing, bool) {
	var pinned []*cacheEntry
	defer func() {
		for _, e := range pinned {
			c.unpin(e)
		}
	}()
	for _, ch := range chunks {
		e := c.pin(chunkName(ch.Digest))
		if e == nil || e.size != ch.Size {
			if e != nil {
				c.unpin(e)
			}
			return nil, false
		}
		pinned = append(pinned, e)
	}
	c.mu.Lock()
	fits := c.unsafeEvict(size)
	if fits {
		c.used += size
	}
	c.mu.Unlock()
	if !fits {
		return nil, false
	}
	unreserve := func() {
		c.mu.Lock()
		c.used -= size
		c.mu.Unlock()
	}
	f, err := os.CreateTemp(c.path("tmp"), "a-")
	if err != nil {
		unreserve()
		return nil, false
	}
	err = f.Truncate(size)
	for i := 0; err == nil && i < len(chunks); i++ {
		err = c.copyChunk(f, pinned[i], chunks[i].Offset)
	}
	if err == nil {
		err = os.Rename(f.Name(), c.path(name))
	}
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		unreserve()
		c.log.Warn("lazyfs: cannot assemble passthrough file", "entry", name, "err", err)
		return nil, false
	}
	c.mu.Lock()
	c.used -= size
	e := c.entries[name]
	if e == nil {
		e = &cacheEntry{name: name, size: size, verified: true}
		c.unsafeAdd(e)
	}
	e.pins++
	c.mu.Unlock()
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		c.unpin(e)
		return nil, false
	}
	return &backing{c: c, e: e, f: f}, true
}

func (c *ChunkCache) copyChunk(dst *os.File, e *cacheEntry, off int64) error {
	src, err := os.Open(c.path(e.name))
	if err != nil {
		return err
	}
	defer src.Close()
	if err := c.verifyEntry(src, e); err != nil {
		return err
	}
	_, err = io.Copy(io.NewOffsetWriter(dst, off), io.NewSectionReader(src, 0, e.size))
	return err
}
