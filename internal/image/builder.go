package image

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// buildConfig drives one layer build.
type buildConfig struct {
	chunkSize   int64
	compress    bool
	keepDevices bool
	workers     int
	log         *slog.Logger
	progress    func(delta int64) // bytes of file content read
}

// builder collects the entries of one layer from any source (tar stream,
// directory walk), chunks regular files through a small pool of hashing /
// compressing / uploading workers, and produces a valid Index.
type builder struct {
	ctx     context.Context
	w       blob.Writer
	cfg     buildConfig
	entries map[string]*Entry
	opaque  map[string]bool

	jobs   chan chunkJob
	wg     sync.WaitGroup
	bufs   sync.Pool
	mu     sync.Mutex
	chunks map[*Entry][]Chunk
	err    error
	stored atomic.Int64 // bytes of chunk blobs (compressed size)
	closed bool
}

type chunkJob struct {
	e    *Entry
	off  int64
	data []byte
	buf  *[]byte
}

func newBuilder(ctx context.Context, w blob.Writer, cfg buildConfig) *builder {
	if cfg.chunkSize == 0 {
		cfg.chunkSize = DefaultChunkSize
	}
	if cfg.workers <= 0 {
		cfg.workers = 4
	}
	if cfg.log == nil {
		cfg.log = slog.New(slog.DiscardHandler)
	}
	b := &builder{
		ctx: ctx, w: w, cfg: cfg,
		entries: map[string]*Entry{},
		opaque:  map[string]bool{},
		jobs:    make(chan chunkJob, cfg.workers),
		chunks:  map[*Entry][]Chunk{},
	}
	cs := int(cfg.chunkSize)
	b.bufs.New = func() any { s := make([]byte, cs); return &s }
	for range cfg.workers {
		b.wg.Go(b.worker)
	}
	return b
}

func (b *builder) worker() {
	zbuf := make([]byte, 0, b.cfg.chunkSize)
	for j := range b.jobs {
		if b.failed() == nil {
			c, n, err := putChunk(b.ctx, b.w, j.data, zbuf, b.cfg.compress)
			c.Offset = j.off
			b.mu.Lock()
			if err != nil && b.err == nil {
				b.err = err
			} else if err == nil {
				b.chunks[j.e] = append(b.chunks[j.e], c)
			}
			b.mu.Unlock()
			b.stored.Add(n)
		}
		b.bufs.Put(j.buf)
	}
}

func (b *builder) failed() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// close stops the workers; safe to call more than once.
func (b *builder) close() {
	if !b.closed {
		b.closed = true
		close(b.jobs)
		b.wg.Wait()
	}
}

func (b *builder) dispatch(e *Entry, off int64, n int64, fill func([]byte) error) error {
	if err := b.ctx.Err(); err != nil {
		return err
	}
	if err := b.failed(); err != nil {
		return err
	}
	buf := b.bufs.Get().(*[]byte)
	data := (*buf)[:n]
	if err := fill(data); err != nil {
		b.bufs.Put(buf)
		return err
	}
	if b.cfg.progress != nil {
		b.cfg.progress(n)
	}
	if isZero(data) {
		// A hole, or zeros that read back the same as one.
		b.bufs.Put(buf)
		return nil
	}
	b.jobs <- chunkJob{e: e, off: off, data: data, buf: buf}
	return nil
}

// add records a non-regular entry (or a regular file without content).
// A later entry for the same path replaces an earlier one, like tar
// extraction does.
func (b *builder) add(e *Entry) {
	b.entries[e.Path] = e
}

// addReg records a regular file and chunks its content read sequentially
// from r (exactly e.Size bytes).
func (b *builder) addReg(e *Entry, r io.Reader, what string) error {
	b.entries[e.Path] = e
	cs := b.cfg.chunkSize
	for off := int64(0); off < e.Size; {
		n := min(cs, e.Size-off)
		err := b.dispatch(e, off, n, func(p []byte) error {
			if m, err := io.ReadFull(r, p); err != nil {
				return fmt.Errorf("%s: %q: content truncated or corrupt at %d of %d bytes (%v): %w", what, e.Path, off+int64(m), e.Size, err, errdefs.ErrInvalidArgument)
			}
			return nil
		})
		if err != nil {
			return err
		}
		off += n
	}
	return nil
}

// addRegFile chunks a file on disk, skipping holes with SEEK_DATA so huge
// sparse files cost nothing; chunk boundaries stay at multiples of the
// chunk size.
func (b *builder) addRegFile(e *Entry, f *os.File) error {
	b.entries[e.Path] = e
	cs := b.cfg.chunkSize
	fd := int(f.Fd())
	for off := int64(0); off < e.Size; {
		next, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			break // only a hole up to EOF
		}
		if err == nil && next > off {
			off = max(off, next/cs*cs)
			if off >= e.Size {
				break
			}
		}
		n := min(cs, e.Size-off)
		err = b.dispatch(e, off, n, func(p []byte) error {
			m, err := f.ReadAt(p, off)
			if m != len(p) {
				return fmt.Errorf("file %q changed while being read (short read at %d: %v): %w", e.Path, off, err, errdefs.ErrFailedPrecondition)
			}
			return nil
		})
		if err != nil {
			return err
		}
		off += n
	}
	return nil
}

// addHardlink records a hardlink to target, which must already be in the
// layer and not be a directory.
func (b *builder) addHardlink(e *Entry, target, what string) error {
	t, ok := b.entries[target]
	if !ok {
		return fmt.Errorf("%s: hardlink %q to %q: target is not in the layer: %w", what, e.Path, target, errdefs.ErrInvalidArgument)
	}
	if t.Type == TypeDir {
		return fmt.Errorf("%s: hardlink %q to directory %q: %w", what, e.Path, target, errdefs.ErrInvalidArgument)
	}
	if t.Type == TypeHardlink {
		target = t.Linkname
	}
	if target == e.Path {
		return nil // a link to itself changes nothing
	}
	e.Type = TypeHardlink
	e.Linkname = target
	b.entries[e.Path] = e
	return nil
}

// setOpaque marks dir opaque (applied in finish, as the directory's own
// entry may come later).
func (b *builder) setOpaque(dir string) { b.opaque[dir] = true }

// finish waits for all chunks and returns the sorted, validated index.
func (b *builder) finish() (*Index, error) {
	b.close()
	if err := b.failed(); err != nil {
		return nil, err
	}
	if err := b.ctx.Err(); err != nil {
		return nil, err
	}
	for e, cs := range b.chunks {
		slices.SortFunc(cs, func(a, b Chunk) int { return int(a.Offset - b.Offset) })
		e.Chunks = cs
	}
	now := time.Unix(0, 0).UTC()
	synth := func(p string) *Entry {
		return &Entry{Path: p, Type: TypeDir, Mode: 0o755, ModTime: now}
	}
	if _, ok := b.entries[""]; !ok {
		b.entries[""] = synth("")
	}
	for d := range b.opaque {
		e, ok := b.entries[d]
		if !ok {
			e = synth(d)
			b.entries[d] = e
		}
		if e.Type != TypeDir {
			return nil, fmt.Errorf("opaque marker for %q, which is not a directory: %w", d, errdefs.ErrInvalidArgument)
		}
		if e.Xattrs == nil {
			e.Xattrs = map[string][]byte{}
		}
		e.Xattrs[XattrOpaque] = []byte("y")
	}
	// Parents missing from the stream are created like tar extraction
	// does; a parent that is not a directory is an error, never followed.
	for p := range b.entries {
		for d := parentOf(p); p != ""; d = parentOf(d) {
			pe, ok := b.entries[d]
			if !ok {
				b.entries[d] = synth(d)
			} else if pe.Type != TypeDir {
				return nil, fmt.Errorf("entry %q: parent %q is a %s, not a directory: %w", p, d, pe.Type, errdefs.ErrInvalidArgument)
			}
			if d == "" {
				break
			}
		}
	}
	if err := b.fixHardlinks(); err != nil {
		return nil, err
	}
	ix := &Index{Version: IndexVersion, ChunkSize: b.cfg.chunkSize, Entries: make([]Entry, 0, len(b.entries))}
	for _, e := range b.entries {
		if e.Type == TypeReg {
			ix.Size += e.Size
		}
		ix.Entries = append(ix.Entries, *e)
	}
	slices.SortFunc(ix.Entries, func(a, b Entry) int { return ComparePaths(a.Path, b.Path) })
	if err := ix.Validate(); err != nil {
		return nil, err
	}
	return ix, nil
}

// fixHardlinks makes the first path (in index order) of each hardlink
// group the one that carries the content, so readers meet the target
// before its links, and copies the target's attributes onto every link.
func (b *builder) fixHardlinks() error {
	groups := map[string][]*Entry{}
	for _, e := range b.entries {
		if e.Type == TypeHardlink {
			groups[e.Linkname] = append(groups[e.Linkname], e)
		}
	}
	for target, links := range groups {
		t, ok := b.entries[target]
		if !ok || t.Type == TypeDir || t.Type == TypeHardlink {
			return fmt.Errorf("hardlink %q: target %q was replaced or removed later in the layer: %w", links[0].Path, target, errdefs.ErrInvalidArgument)
		}
		first := t
		for _, l := range links {
			if ComparePaths(l.Path, first.Path) < 0 {
				first = l
			}
		}
		if first != t {
			p := first.Path
			*first = *t
			first.Path = p
			*t = Entry{Path: t.Path}
			links = append(links, t)
		}
		for _, l := range links {
			if l == first {
				continue
			}
			p := l.Path
			*l = *first
			l.Path, l.Type, l.Linkname, l.Chunks = p, TypeHardlink, first.Path, nil
		}
	}
	return nil
}

func parentOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return ""
}

// cleanEntryPath turns an archive name into an index path, rejecting
// absolute names and names that climb out of the layer.
func cleanEntryPath(name, what string) (string, error) {
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("%s: entry %q: absolute path: %w", what, name, errdefs.ErrInvalidArgument)
	}
	p := path.Clean(name)
	if p == ".." || strings.HasPrefix(p, "../") {
		return "", fmt.Errorf("%s: entry %q: path escapes the layer: %w", what, name, errdefs.ErrInvalidArgument)
	}
	if p == "." {
		return "", nil
	}
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("%s: entry %q: NUL in path: %w", what, name, errdefs.ErrInvalidArgument)
	}
	return p, nil
}
