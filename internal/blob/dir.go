package blob

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// DirStore keeps blobs as files under <root>/sha256/<2 hex>/<64 hex>.
//
// Writes go to a unique temp file under <root>/tmp on the same file system,
// are fsynced and renamed into place, so readers never see a partial blob
// and any number of processes or nodes can share one root (a local disk or
// a shared mount: 3FS, CephFS, NFS). Two writers of the same blob race
// harmlessly: both renames install identical bytes.
type DirStore struct {
	root    string
	syncDir bool
}

// DirOpt configures a DirStore.
type DirOpt func(*DirStore)

// WithDirSync also fsyncs the fan-out directory after each rename, so a new
// blob survives a power loss (not only its bytes). Off by default: a lost
// blob is re-imported, and the extra fsync costs much on shared mounts.
func WithDirSync(on bool) DirOpt { return func(s *DirStore) { s.syncDir = on } }

var _ Store = (*DirStore)(nil)

// staleTemp is the age after which an abandoned temp file (a writer that
// crashed) is removed when a store is opened.
const staleTemp = 24 * time.Hour

// NewDirStore opens (creating if needed) a blob directory.
func NewDirStore(root string, opts ...DirOpt) (*DirStore, error) {
	s := &DirStore{root: root}
	for _, o := range opts {
		o(s)
	}
	for _, d := range []string{"sha256", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o700); err != nil {
			return nil, fmt.Errorf("blob dir store: %w", err)
		}
	}
	if ents, err := os.ReadDir(filepath.Join(root, "tmp")); err == nil {
		for _, e := range ents {
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > staleTemp {
				os.Remove(filepath.Join(root, "tmp", e.Name()))
			}
		}
	}
	return s, nil
}

// Root returns the store's directory.
func (s *DirStore) Root() string { return s.root }

func (s *DirStore) path(d Digest) (string, error) {
	if err := d.Validate(); err != nil {
		return "", err
	}
	h := d.Hex()
	return filepath.Join(s.root, "sha256", h[:2], h), nil
}

func notFound(d Digest, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blob %s: %w", d, errdefs.ErrNotFound)
	}
	return fmt.Errorf("blob %s: %w", d, err)
}

// ReadAt implements Reader with one pread.
func (s *DirStore) ReadAt(ctx context.Context, d Digest, p []byte, off int64) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, fmt.Errorf("blob %s: negative offset %d: %w", d, off, errdefs.ErrInvalidArgument)
	}
	name, err := s.path(d)
	if err != nil {
		return 0, err
	}
	f, err := os.Open(name)
	if err != nil {
		return 0, notFound(d, err)
	}
	defer f.Close()
	n, err := f.ReadAt(p, off)
	if err != nil && err != io.EOF {
		return n, fmt.Errorf("blob %s: %w", d, err)
	}
	return n, err
}

// Stat implements Reader.
func (s *DirStore) Stat(ctx context.Context, d Digest) (Info, error) {
	name, err := s.path(d)
	if err != nil {
		return Info{}, err
	}
	fi, err := os.Stat(name)
	if err != nil {
		return Info{}, notFound(d, err)
	}
	return Info{Digest: d, Size: fi.Size(), ModTime: fi.ModTime()}, nil
}

// Put implements Writer. With a known digest and an existing blob it does
// not read r: the stored blob was verified when written.
func (s *DirStore) Put(ctx context.Context, expected Digest, r io.Reader) (Info, error) {
	if expected != "" {
		name, err := s.path(expected)
		if err != nil {
			return Info{}, err
		}
		if info, ok := s.refresh(name, expected); ok {
			return info, nil
		}
	}
	tmp, err := os.CreateTemp(filepath.Join(s.root, "tmp"), "put-*")
	if err != nil {
		return Info{}, fmt.Errorf("blob put: %w", err)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), ctxReader{ctx, r})
	if err != nil {
		return Info{}, fmt.Errorf("blob put: %w", err)
	}
	d := FromHash(h.Sum(nil))
	if expected != "" && d != expected {
		return Info{}, fmt.Errorf("blob put: content hashes to %s, expected %s: %w", d, expected, ErrDigestMismatch)
	}
	if err := tmp.Sync(); err != nil {
		return Info{}, fmt.Errorf("blob put: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return Info{}, fmt.Errorf("blob put: %w", err)
	}
	name, _ := s.path(d)
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		return Info{}, fmt.Errorf("blob put: %w", err)
	}
	// Blobs are immutable: read-only files guard against accidental edits
	// through the shared mount.
	if err := os.Chmod(tmp.Name(), 0o444); err != nil {
		return Info{}, fmt.Errorf("blob put: %w", err)
	}
	if err := os.Rename(tmp.Name(), name); err != nil {
		return Info{}, fmt.Errorf("blob put: %w", err)
	}
	done = true
	if s.syncDir {
		if df, err := os.Open(filepath.Dir(name)); err == nil {
			err = df.Sync()
			df.Close()
			if err != nil {
				return Info{}, fmt.Errorf("blob put: sync dir: %w", err)
			}
		}
	}
	return Info{Digest: d, Size: n, ModTime: time.Now()}, nil
}

// refresh reports an existing blob and bumps its mtime so a concurrent GC
// with a grace period keeps it for the writer that just reused it.
func (s *DirStore) refresh(name string, d Digest) (Info, bool) {
	fi, err := os.Stat(name)
	if err != nil || !fi.Mode().IsRegular() {
		return Info{}, false
	}
	now := time.Now()
	if err := os.Chtimes(name, now, now); err != nil {
		// A read-only mount still serves the blob; GC there is moot.
		now = fi.ModTime()
	}
	return Info{Digest: d, Size: fi.Size(), ModTime: now}, true
}

// Delete implements Store.
func (s *DirStore) Delete(ctx context.Context, d Digest) error {
	name, err := s.path(d)
	if err != nil {
		return err
	}
	if err := os.Remove(name); err != nil {
		return notFound(d, err)
	}
	return nil
}

// Walk implements Store, in no particular order. Files that are not blobs
// (foreign names) are skipped.
func (s *DirStore) Walk(ctx context.Context, fn func(Info) error) error {
	top := filepath.Join(s.root, "sha256")
	fans, err := os.ReadDir(top)
	if err != nil {
		return fmt.Errorf("blob walk: %w", err)
	}
	for _, fan := range fans {
		if !fan.IsDir() || len(fan.Name()) != 2 {
			continue
		}
		ents, err := os.ReadDir(filepath.Join(top, fan.Name()))
		if err != nil {
			return fmt.Errorf("blob walk: %w", err)
		}
		for _, e := range ents {
			if err := ctx.Err(); err != nil {
				return err
			}
			d := Digest("sha256:" + e.Name())
			if d.Validate() != nil || !strings.HasPrefix(e.Name(), fan.Name()) {
				continue
			}
			fi, err := e.Info()
			if err != nil {
				continue // deleted meanwhile
			}
			if err := fn(Info{Digest: d, Size: fi.Size(), ModTime: fi.ModTime()}); err != nil {
				return err
			}
		}
	}
	return nil
}

// ctxReader stops a long copy when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
