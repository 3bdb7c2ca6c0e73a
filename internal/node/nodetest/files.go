package nodetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
)

// hostPath maps a sandbox path onto the fake's directory; Clean of a
// rooted path cannot climb above the root.
func (f *Fake) hostPath(sandboxID, p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("path %q is not absolute: %w", p, errdefs.ErrInvalidArgument)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.get(sandboxID)
	if err != nil {
		return "", err
	}
	if sb.rec.State == node.StateDead {
		return "", fmt.Errorf("sandbox %s is dead: %w", sandboxID, errdefs.ErrFailedPrecondition)
	}
	return filepath.Join(f.dir, sandboxID, path.Clean(p)), nil
}

func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%v: %w", err, errdefs.ErrNotFound)
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("%v: %w", err, errdefs.ErrAlreadyExists)
	}
	return err
}

func (f *Fake) info(host, p string) (*node.FileInfo, error) {
	fi, err := os.Lstat(host)
	if err != nil {
		return nil, classify(err)
	}
	return &node.FileInfo{
		Name: path.Base(p), Path: path.Clean(p), Size: fi.Size(), Mode: fi.Mode(),
		ModTime: fi.ModTime(), IsDir: fi.IsDir(),
	}, nil
}

// ReadFile implements node.Agent.
func (f *Fake) ReadFile(ctx context.Context, sandboxID, p string) (io.ReadCloser, *node.FileInfo, error) {
	f.count("ReadFile")
	host, err := f.hostPath(sandboxID, p)
	if err != nil {
		return nil, nil, err
	}
	info, err := f.info(host, p)
	if err != nil {
		return nil, nil, err
	}
	if info.IsDir {
		return nil, nil, fmt.Errorf("%s is a directory: %w", p, errdefs.ErrInvalidArgument)
	}
	r, err := os.Open(host)
	if err != nil {
		return nil, nil, classify(err)
	}
	return r, info, nil
}

// WriteFile implements node.Agent.
func (f *Fake) WriteFile(ctx context.Context, sandboxID, p string, mode os.FileMode, r io.Reader) (*node.FileInfo, error) {
	f.count("WriteFile")
	host, err := f.hostPath(sandboxID, p)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(host), 0o755); err != nil {
		return nil, classify(err)
	}
	w, err := os.OpenFile(host, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode.Perm())
	if err != nil {
		return nil, classify(err)
	}
	if _, err := io.Copy(w, r); err != nil {
		w.Close()
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return f.info(host, p)
}

// StatFile implements node.Agent.
func (f *Fake) StatFile(ctx context.Context, sandboxID, p string) (*node.FileInfo, error) {
	f.count("StatFile")
	host, err := f.hostPath(sandboxID, p)
	if err != nil {
		return nil, err
	}
	return f.info(host, p)
}

// ListDir implements node.Agent.
func (f *Fake) ListDir(ctx context.Context, sandboxID, p string, depth int) ([]node.FileInfo, error) {
	f.count("ListDir")
	host, err := f.hostPath(sandboxID, p)
	if err != nil {
		return nil, err
	}
	if depth < 1 {
		depth = 1
	}
	var out []node.FileInfo
	var walk func(host, p string, d int) error
	walk = func(host, p string, d int) error {
		ents, err := os.ReadDir(host)
		if err != nil {
			return classify(err)
		}
		for _, e := range ents {
			cp := path.Join(p, e.Name())
			fi, err := f.info(filepath.Join(host, e.Name()), cp)
			if err != nil {
				return err
			}
			out = append(out, *fi)
			if fi.IsDir && d < depth {
				if err := walk(filepath.Join(host, e.Name()), cp, d+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(host, path.Clean(p), 1); err != nil {
		return nil, err
	}
	return out, nil
}

// MakeDir implements node.Agent.
func (f *Fake) MakeDir(ctx context.Context, sandboxID, p string, mode os.FileMode) error {
	f.count("MakeDir")
	host, err := f.hostPath(sandboxID, p)
	if err != nil {
		return err
	}
	return classify(os.MkdirAll(host, mode.Perm()))
}

// Remove implements node.Agent.
func (f *Fake) Remove(ctx context.Context, sandboxID, p string, recursive bool) error {
	f.count("Remove")
	host, err := f.hostPath(sandboxID, p)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(host); err != nil {
		return classify(err)
	}
	if recursive {
		return classify(os.RemoveAll(host))
	}
	return classify(os.Remove(host))
}

// Rename implements node.Agent.
func (f *Fake) Rename(ctx context.Context, sandboxID, from, to string) error {
	f.count("Rename")
	src, err := f.hostPath(sandboxID, from)
	if err != nil {
		return err
	}
	dst, err := f.hostPath(sandboxID, to)
	if err != nil {
		return err
	}
	return classify(os.Rename(src, dst))
}
