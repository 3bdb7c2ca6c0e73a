package image

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// unpackWorkers fetch file contents concurrently: chunk reads from a
// shared mount or S3 are latency bound.
const unpackWorkers = 8

// Unpack materialises a layer into dir (created; it must not exist or be
// empty) with exact attributes: owners, modes incl. setuid, xattrs incl.
// trusted.overlay.opaque, whiteouts as 0/0 char devices, hardlinks,
// symlinks (never followed), device nodes, mtimes, and holes where the
// index has no chunk. Every chunk is verified. It needs root (chown,
// trusted.* xattrs, mknod). On error dir is left partially filled; callers
// unpack into a temporary name and rename (UnpackProvider does).
func Unpack(ctx context.Context, r blob.Reader, layer blob.Digest, dir string) error {
	ix, err := ReadIndex(ctx, r, layer)
	if err != nil {
		return err
	}
	return unpackIndex(ctx, r, ix, dir)
}

func unpackIndex(ctx context.Context, r blob.Reader, ix *Index, dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("unpack: %w", err)
	}
	if ents, err := os.ReadDir(dir); err != nil {
		return fmt.Errorf("unpack: %w", err)
	} else if len(ents) > 0 {
		return fmt.Errorf("unpack: %s is not empty: %w", dir, errdefs.ErrAlreadyExists)
	}
	// Phase 1: the tree. Index order puts parents first and Validate
	// guarantees every parent is a directory we created ourselves, so no
	// path below dir can be a symlink while we build it.
	var files []*Entry
	for i := range ix.Entries {
		e := &ix.Entries[i]
		full := filepath.Join(dir, e.Path)
		var err error
		switch e.Type {
		case TypeDir:
			if e.Path != "" {
				err = os.Mkdir(full, 0o700)
			}
		case TypeReg:
			var f *os.File
			f, err = os.OpenFile(full, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o600)
			if err == nil {
				err = f.Truncate(e.Size) // a sparse file; chunks fill the data
				f.Close()
			}
			if len(e.Chunks) > 0 {
				files = append(files, e)
			}
		case TypeSymlink:
			err = os.Symlink(e.Linkname, full)
		case TypeHardlink:
			err = os.Link(filepath.Join(dir, e.Linkname), full)
		case TypeChar, TypeBlock, TypeFifo:
			err = unix.Mknod(full, e.UnixMode(), int(unix.Mkdev(uint32(e.Devmajor), uint32(e.Devminor))))
		}
		if err != nil {
			return fmt.Errorf("unpack %q: %w", e.Path, err)
		}
	}
	// Phase 2: contents.
	if err := fillFiles(ctx, r, dir, files); err != nil {
		return err
	}
	// Phase 3: attributes; directory times last, deepest first, since
	// creating children changed them.
	for i := range ix.Entries {
		e := &ix.Entries[i]
		if e.Type == TypeHardlink {
			continue // shares the target's inode
		}
		if err := setAttrs(filepath.Join(dir, e.Path), e); err != nil {
			return fmt.Errorf("unpack %q: %w", e.Path, err)
		}
	}
	for i := len(ix.Entries) - 1; i >= 0; i-- {
		e := &ix.Entries[i]
		if e.Type == TypeHardlink {
			continue
		}
		if err := setTimes(filepath.Join(dir, e.Path), e); err != nil {
			return fmt.Errorf("unpack %q: %w", e.Path, err)
		}
	}
	return nil
}

func fillFiles(ctx context.Context, r blob.Reader, dir string, files []*Entry) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	jobs := make(chan *Entry)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		ferr error
	)
	for range unpackWorkers {
		wg.Go(func() {
			buf := make([]byte, 0, 2*MaxChunkSize)
			for e := range jobs {
				if err := fillFile(ctx, r, filepath.Join(dir, e.Path), e, buf); err != nil {
					mu.Lock()
					if ferr == nil {
						ferr = fmt.Errorf("unpack %q: %w", e.Path, err)
					}
					mu.Unlock()
					cancel()
				}
			}
		})
	}
	for _, e := range files {
		select {
		case jobs <- e:
		case <-ctx.Done():
		}
	}
	close(jobs)
	wg.Wait()
	if ferr != nil {
		return ferr
	}
	return ctx.Err()
}

func fillFile(ctx context.Context, r blob.Reader, full string, e *Entry, buf []byte) error {
	f, err := os.OpenFile(full, os.O_WRONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, c := range e.Chunks {
		data, err := ReadChunk(ctx, r, c, buf)
		if err != nil {
			return err
		}
		if _, err := f.WriteAt(data, c.Offset); err != nil {
			return err
		}
	}
	return f.Close()
}

func setAttrs(full string, e *Entry) error {
	if err := os.Lchown(full, e.UID, e.GID); err != nil {
		return err
	}
	for k, v := range e.Xattrs {
		if e.Type == TypeSymlink && strings.HasPrefix(k, "user.") {
			continue // Linux allows no user.* xattrs on symlinks
		}
		if err := unix.Lsetxattr(full, k, v, 0); err != nil {
			return fmt.Errorf("setxattr %s: %w", k, err)
		}
	}
	if e.Type == TypeSymlink {
		return nil // symlink modes are fixed on Linux
	}
	// After chown, which clears setuid/setgid.
	return unix.Fchmodat(unix.AT_FDCWD, full, e.UnixMode()&0o7777, 0)
}

func setTimes(full string, e *Entry) error {
	ts := unix.NsecToTimespec(e.ModTime.UnixNano())
	return unix.UtimesNanoAt(unix.AT_FDCWD, full, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}
