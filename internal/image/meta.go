package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Record is what the metadata store keeps per tag: a pointer to an
// immutable, digest-addressed manifest blob, plus ownership. Everything
// else about an image lives in the blob store.
type Record struct {
	Ref      string      `json:"ref"` // NAME:TAG
	Manifest blob.Digest `json:"manifest"`
	Owner    string      `json:"owner,omitempty"`
	Public   bool        `json:"public,omitempty"`
	Updated  time.Time   `json:"updated"`
}

// MetaStore keeps tags. It is tiny and mutable, unlike the blob store; the
// control plane may back it with bbolt or etcd.
type MetaStore interface {
	GetRef(ctx context.Context, ref string) (Record, error) // ErrNotFound
	PutRef(ctx context.Context, rec Record) error
	DeleteRef(ctx context.Context, ref string) error // ErrNotFound
	ListRefs(ctx context.Context) ([]Record, error)
}

// DirMeta is a MetaStore of one JSON file per tag in a directory. It was
// chosen over bbolt because it works unchanged on the same shared mount as
// a dir blob store (bbolt's file lock does not span nodes and its mmap is
// unsafe on NFS), writes are atomic by rename, and it needs no dependency.
// Last writer wins per tag, which is the semantics of re-tagging anyway.
type DirMeta struct{ dir string }

var _ MetaStore = (*DirMeta)(nil)

// NewDirMeta opens (creating) a tag directory.
func NewDirMeta(dir string) (*DirMeta, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("image meta: %w", err)
	}
	return &DirMeta{dir: dir}, nil
}

// File names are the path-escaped ref, so "a/b:c" cannot climb out.
func (m *DirMeta) file(ref string) string {
	return filepath.Join(m.dir, url.PathEscape(ref)+".json")
}

// GetRef implements MetaStore.
func (m *DirMeta) GetRef(ctx context.Context, ref string) (Record, error) {
	b, err := os.ReadFile(m.file(ref))
	if errors.Is(err, fs.ErrNotExist) {
		return Record{}, fmt.Errorf("image %s: %w", ref, errdefs.ErrNotFound)
	}
	if err != nil {
		return Record{}, fmt.Errorf("image %s: %w", ref, err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, fmt.Errorf("image %s: corrupt record: %w", ref, err)
	}
	return r, nil
}

// PutRef implements MetaStore.
func (m *DirMeta) PutRef(ctx context.Context, rec Record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(m.dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("image meta: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("image meta: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("image meta: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("image meta: %w", err)
	}
	if err := os.Rename(f.Name(), m.file(rec.Ref)); err != nil {
		return fmt.Errorf("image meta: %w", err)
	}
	return nil
}

// DeleteRef implements MetaStore.
func (m *DirMeta) DeleteRef(ctx context.Context, ref string) error {
	err := os.Remove(m.file(ref))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("image %s: %w", ref, errdefs.ErrNotFound)
	}
	return err
}

// ListRefs implements MetaStore.
func (m *DirMeta) ListRefs(ctx context.Context) ([]Record, error) {
	ents, err := os.ReadDir(m.dir)
	if err != nil {
		return nil, fmt.Errorf("image meta: %w", err)
	}
	var out []Record
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(name, ".tmp-") {
			continue
		}
		ref, err := url.PathUnescape(name)
		if err != nil {
			continue
		}
		r, err := m.GetRef(ctx, ref)
		if errdefs.IsNotFound(err) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}
