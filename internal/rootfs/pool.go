package rootfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// MinDiskBytes is the smallest disk limit accepted (ext4 needs room for its
// metadata).
const MinDiskBytes = 16 << 20

// DiskPool hands out pre-formatted sparse ext4 images so that a create
// does not pay for mkfs. It keeps Target ready images for every size it has
// been asked for (or was told to warm) and refills in the background.
type DiskPool struct {
	dir    string
	target int
	mkfs   string
	log    *slog.Logger

	mu    sync.Mutex
	ready map[int64][]string
	busy  map[int64]bool // a refill for this size is running
	seq   uint64
	wg    sync.WaitGroup
	ctx   context.Context
	stop  context.CancelFunc

	tmplMu sync.Mutex // serialises making a size's template
}

// PoolOption configures a DiskPool.
type PoolOption func(*DiskPool)

// WithPoolTarget sets how many ready images are kept per size (default 4).
func WithPoolTarget(n int) PoolOption { return func(p *DiskPool) { p.target = n } }

// WithPoolLogger sets the logger.
func WithPoolLogger(l *slog.Logger) PoolOption { return func(p *DiskPool) { p.log = l } }

// WithMkfs sets the mkfs.ext4 binary (default: looked up in PATH).
func WithMkfs(path string) PoolOption { return func(p *DiskPool) { p.mkfs = path } }

// NewDiskPool uses dir (created if missing; it must be on the same file
// system as the sandbox dirs so images move by rename). Images left by an
// earlier run are discarded.
func NewDiskPool(dir string, opts ...PoolOption) (*DiskPool, error) {
	p := &DiskPool{dir: dir, target: 4, log: slog.New(slog.DiscardHandler), ready: map[int64][]string{}, busy: map[int64]bool{}}
	for _, o := range opts {
		o(p)
	}
	if p.mkfs == "" {
		m, err := exec.LookPath("mkfs.ext4")
		if err != nil {
			return nil, fmt.Errorf("mkfs.ext4 not found (install e2fsprogs): %w", errdefs.ErrFailedPrecondition)
		}
		p.mkfs = m
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p.ctx, p.stop = context.WithCancel(context.Background())
	return p, nil
}

// Warm starts filling the pool for size.
func (p *DiskPool) Warm(size int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refillLocked(size)
}

// Ready reports how many images of size are ready.
func (p *DiskPool) Ready(size int64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready[size])
}

// Take moves a formatted image of size to dst, formatting one inline when
// none is ready, and schedules a refill.
func (p *DiskPool) Take(ctx context.Context, size int64, dst string) error {
	if size < MinDiskBytes {
		return fmt.Errorf("disk size %d is below the minimum of %d: %w", size, MinDiskBytes, errdefs.ErrInvalidArgument)
	}
	p.mu.Lock()
	var img string
	if l := p.ready[size]; len(l) > 0 {
		img, p.ready[size] = l[len(l)-1], l[:len(l)-1]
	}
	p.refillLocked(size)
	p.mu.Unlock()
	if img != "" {
		err := os.Rename(img, dst)
		if err == nil {
			return nil
		}
		_ = os.Remove(img)
		if !errors.Is(err, syscall.EXDEV) {
			return err
		}
	}
	return p.format(ctx, size, dst)
}

func (p *DiskPool) refillLocked(size int64) {
	if p.busy[size] || len(p.ready[size]) >= p.target || p.ctx.Err() != nil {
		return
	}
	p.busy[size] = true
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			p.mu.Lock()
			if len(p.ready[size]) >= p.target || p.ctx.Err() != nil {
				p.busy[size] = false
				p.mu.Unlock()
				return
			}
			p.seq++
			name := filepath.Join(p.dir, strconv.FormatInt(size, 10)+"-"+strconv.FormatUint(p.seq, 10)+".img")
			p.mu.Unlock()
			if err := p.format(p.ctx, size, name); err != nil {
				if p.ctx.Err() == nil {
					p.log.Warn("disk pool refill failed", "size", size, "err", err)
				}
				p.mu.Lock()
				p.busy[size] = false
				p.mu.Unlock()
				return
			}
			p.mu.Lock()
			p.ready[size] = append(p.ready[size], name)
			p.mu.Unlock()
		}
	}()
}

// format writes a sparse ext4 image of size to dst. mkfs runs once per
// size, into a template; every later image is a sparse copy of it (only
// the few hundred KiB of metadata are copied), which is an order of
// magnitude cheaper than mkfs and keeps the pool ahead of fast creates.
func (p *DiskPool) format(ctx context.Context, size int64, dst string) error {
	tmpl, err := p.template(ctx, size)
	if err != nil {
		return err
	}
	tmp := dst + ".tmp"
	if err := copySparse(tmpl, tmp); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("disk image from template: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// template returns the formatted image every image of size is copied from.
func (p *DiskPool) template(ctx context.Context, size int64) (string, error) {
	p.tmplMu.Lock()
	defer p.tmplMu.Unlock()
	path := filepath.Join(p.dir, "template-"+strconv.FormatInt(size, 10)+".img")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := mkfsImage(ctx, p.mkfs, size, path); err != nil {
		return "", err
	}
	return path, nil
}

// mkfsImage writes a sparse ext4 image: no journal (the sandbox's disk dies
// with it), no reserved blocks (the limit is exact, also for root), and no
// inode table zeroing (a new sparse file reads as zeros).
func mkfsImage(ctx context.Context, mkfs string, size int64, dst string) error {
	return makeSparseImage(ctx, dst, size, mkfs, "-q", "-F", "-O", "^has_journal", "-m", "0",
		"-E", "nodiscard,assume_storage_prezeroed=1")
}

// makeSparseImage writes a sparse file of size to dst and formats it with
// mkfs args... FILE, atomically: dst appears only once formatted.
func makeSparseImage(ctx context.Context, dst string, size int64, mkfs string, args ...string) error {
	tmp := dst + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		cmd := exec.CommandContext(ctx, mkfs, append(args, tmp)...)
		if out, cerr := cmd.CombinedOutput(); cerr != nil {
			err = fmt.Errorf("%s: %v: %s", filepath.Base(mkfs), cerr, bytes.TrimSpace(out))
		}
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// copySparse copies src to dst keeping holes: only data extents are copied
// (SEEK_DATA/SEEK_HOLE + copy_file_range, in the kernel).
func copySparse(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	size := st.Size()
	if err := out.Truncate(size); err != nil {
		out.Close()
		return err
	}
	sfd, dfd := int(in.Fd()), int(out.Fd())
	var off int64
	for off < size {
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			break // only a hole is left
		}
		if err != nil {
			out.Close()
			return err
		}
		hole, err := unix.Seek(sfd, data, unix.SEEK_HOLE)
		if err != nil {
			out.Close()
			return err
		}
		for pos := data; pos < hole; {
			ro, wo := pos, pos
			n, err := unix.CopyFileRange(sfd, &ro, dfd, &wo, int(hole-pos), 0)
			if err != nil {
				out.Close()
				return err
			}
			if n == 0 {
				out.Close()
				return fmt.Errorf("copy %s: short copy at %d", src, pos)
			}
			pos += int64(n)
		}
		off = hole
	}
	return out.Close()
}

// Close stops refills and deletes the ready images.
func (p *DiskPool) Close() error {
	p.stop()
	p.wg.Wait()
	return os.RemoveAll(p.dir)
}
