package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"strconv"

	"github.com/dsec-dev/dsec/internal/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// checkPath rejects relative sandbox paths early: the server resolves paths
// from the sandbox root only.
func checkPath(p string) error {
	if p == "" || !path.IsAbs(p) {
		return fmt.Errorf("sandbox path %q must be absolute: %w", p, errdefs.ErrInvalidArgument)
	}
	return nil
}

func fileQuery(p string) url.Values { return url.Values{"path": {p}} }

// ReadFile opens a file in a sandbox for streaming. The returned FileInfo
// carries the size and mode the server reported (Size is -1 when unknown).
// The caller must close the reader.
func (c *Client) ReadFile(ctx context.Context, sandboxID, p string) (io.ReadCloser, *FileInfo, error) {
	if err := need("sandbox id", sandboxID); err != nil {
		return nil, nil, err
	}
	if err := checkPath(p); err != nil {
		return nil, nil, err
	}
	resp, err := c.download(ctx, sandboxPath(sandboxID, "/files"), fileQuery(p))
	if err != nil {
		return nil, nil, err
	}
	fi := &FileInfo{Name: path.Base(p), Path: p, Size: resp.ContentLength}
	if m := resp.Header.Get("X-Dsec-Mode"); m != "" {
		if v, err := strconv.ParseUint(m, 8, 32); err == nil {
			fi.Mode = os.FileMode(v)
		}
	}
	return resp.Body, fi, nil
}

// WriteFile creates or replaces a file in a sandbox with the bytes of r
// (streamed, any size). Parent directories must exist. mode 0 means 0644.
func (c *Client) WriteFile(ctx context.Context, sandboxID, p string, mode os.FileMode, r io.Reader) (*FileInfo, error) {
	if err := need("sandbox id", sandboxID); err != nil {
		return nil, err
	}
	if err := checkPath(p); err != nil {
		return nil, err
	}
	if mode == 0 {
		mode = 0o644
	}
	if mode&^os.ModePerm&^(os.ModeSetuid|os.ModeSetgid|os.ModeSticky) != 0 {
		return nil, fmt.Errorf("file mode %v is not a plain permission mode: %w", mode, errdefs.ErrInvalidArgument)
	}
	q := fileQuery(p)
	q.Set("mode", fmt.Sprintf("%04o", uint32(mode.Perm())|specialBits(mode)))
	if r == nil {
		r = http.NoBody
	}
	req, err := c.newRequest(ctx, http.MethodPut, sandboxPath(sandboxID, "/files"), q, r)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var fi FileInfo
	if err := decodeJSON(resp, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// specialBits maps Go's setuid/setgid/sticky flags to their octal bits.
func specialBits(m os.FileMode) uint32 {
	var b uint32
	if m&os.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}

// Stat describes one path in a sandbox.
func (c *Client) Stat(ctx context.Context, sandboxID, p string) (*FileInfo, error) {
	if err := need("sandbox id", sandboxID); err != nil {
		return nil, err
	}
	if err := checkPath(p); err != nil {
		return nil, err
	}
	var fi FileInfo
	if err := c.call(ctx, http.MethodGet, sandboxPath(sandboxID, "/files/stat"), fileQuery(p), nil, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// ListDir lists a directory down to depth levels (1 = its entries only).
func (c *Client) ListDir(ctx context.Context, sandboxID, p string, depth int) ([]FileInfo, error) {
	if err := need("sandbox id", sandboxID); err != nil {
		return nil, err
	}
	if err := checkPath(p); err != nil {
		return nil, err
	}
	if depth < 1 {
		return nil, fmt.Errorf("list depth must be at least 1, got %d: %w", depth, errdefs.ErrInvalidArgument)
	}
	q := fileQuery(p)
	q.Set("depth", strconv.Itoa(depth))
	var out []FileInfo
	if err := c.call(ctx, http.MethodGet, sandboxPath(sandboxID, "/files/list"), q, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// MakeDir creates a directory and its missing parents (mode 0 = 0755).
func (c *Client) MakeDir(ctx context.Context, sandboxID, p string, mode os.FileMode) error {
	if err := need("sandbox id", sandboxID); err != nil {
		return err
	}
	if err := checkPath(p); err != nil {
		return err
	}
	if mode == 0 {
		mode = 0o755
	}
	return c.call(ctx, http.MethodPost, sandboxPath(sandboxID, "/files/mkdir"), nil,
		api.MkdirRequest{Path: p, Mode: uint32(mode.Perm())}, nil)
}

// Remove deletes a file, or a directory tree when recursive is set.
func (c *Client) Remove(ctx context.Context, sandboxID, p string, recursive bool) error {
	if err := need("sandbox id", sandboxID); err != nil {
		return err
	}
	if err := checkPath(p); err != nil {
		return err
	}
	q := fileQuery(p)
	if recursive {
		q.Set("recursive", "true")
	}
	return c.call(ctx, http.MethodDelete, sandboxPath(sandboxID, "/files"), q, nil, nil)
}

// Rename moves a path inside a sandbox.
func (c *Client) Rename(ctx context.Context, sandboxID, from, to string) error {
	if err := need("sandbox id", sandboxID); err != nil {
		return err
	}
	if err := checkPath(from); err != nil {
		return err
	}
	if err := checkPath(to); err != nil {
		return err
	}
	return c.call(ctx, http.MethodPost, sandboxPath(sandboxID, "/files/rename"), nil,
		api.RenameRequest{From: from, To: to}, nil)
}
