package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// importFrame is one NDJSON frame of an import reply: progress, the final
// image, or an error.
type importFrame struct {
	ImportProgress
	Image *ImageInfo `json:"image,omitempty"`
	Error string     `json:"error,omitempty"`
	Code  string     `json:"code,omitempty"`
}

// ImportImageFromPath asks the server to import from a path on the server's
// own host (admin only): an OCI layout directory, an OCI or docker-archive
// tar, a root file-system directory or a root file-system tar. progress may
// be nil.
func (c *Client) ImportImageFromPath(ctx context.Context, ref, serverPath string, public bool, progress func(ImportProgress)) (*ImageInfo, error) {
	if err := need("image reference", ref); err != nil {
		return nil, err
	}
	if !filepath.IsAbs(serverPath) {
		return nil, fmt.Errorf("server-side import path %q must be absolute: %w", serverPath, errdefs.ErrInvalidArgument)
	}
	q := url.Values{"ref": {ref}, "path": {serverPath}}
	if public {
		q.Set("public", "true")
	}
	return c.importStream(ctx, "/v1/images/import", q, nil, progress)
}

// ImportImage uploads a tar stream (OCI archive, docker-archive or rootfs
// tar) as image ref. progress may be nil.
func (c *Client) ImportImage(ctx context.Context, ref string, tar io.Reader, public bool, progress func(ImportProgress)) (*ImageInfo, error) {
	if err := need("image reference", ref); err != nil {
		return nil, err
	}
	if tar == nil {
		return nil, fmt.Errorf("import of %s: no tar stream: %w", ref, errdefs.ErrInvalidArgument)
	}
	q := url.Values{"ref": {ref}}
	if public {
		q.Set("public", "true")
	}
	return c.importStream(ctx, "/v1/images/import", q, tar, progress)
}

// PullImage asks the server to fetch ref from its configured registry.
// This route (POST /v1/images/pull) is an extension of the native contract;
// servers without it answer 404 or 501.
func (c *Client) PullImage(ctx context.Context, ref string, public bool, progress func(ImportProgress)) (*ImageInfo, error) {
	if err := need("image reference", ref); err != nil {
		return nil, err
	}
	q := url.Values{"ref": {ref}}
	if public {
		q.Set("public", "true")
	}
	return c.importStream(ctx, "/v1/images/pull", q, nil, progress)
}

func (c *Client) importStream(ctx context.Context, p string, q url.Values, body io.Reader, progress func(ImportProgress)) (*ImageInfo, error) {
	req, err := c.newRequest(ctx, http.MethodPost, p, q, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/x-tar")
	}
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var f importFrame
		if err := dec.Decode(&f); err != nil {
			return nil, fmt.Errorf("import of %s: %w", q.Get("ref"), streamErr(err))
		}
		switch {
		case f.Image != nil:
			return f.Image, nil
		case f.Error != "" || f.Code != "":
			return nil, frameError(f.Error, f.Code)
		case progress != nil:
			progress(f.ImportProgress)
		}
	}
}

func imagePath(ref string, rest ...string) string {
	p := "/v1/images/" + esc(ref)
	for _, r := range rest {
		p += r
	}
	return p
}

// ListImages lists the images the caller can use.
func (c *Client) ListImages(ctx context.Context) ([]ImageInfo, error) {
	var out []ImageInfo
	if err := c.call(ctx, http.MethodGet, "/v1/images", nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// GetImage describes one image version.
func (c *Client) GetImage(ctx context.Context, ref string) (*ImageInfo, error) {
	if err := need("image reference", ref); err != nil {
		return nil, err
	}
	var out ImageInfo
	if err := c.call(ctx, http.MethodGet, imagePath(ref), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RemoveImage deletes an image version (its blobs go at the next GC).
func (c *Client) RemoveImage(ctx context.Context, ref string) error {
	if err := need("image reference", ref); err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, imagePath(ref), nil, nil, nil)
}

// GCImages removes blobs no image or sandbox uses.
func (c *Client) GCImages(ctx context.Context) (*GCResult, error) {
	var out GCResult
	if err := c.call(ctx, http.MethodPost, "/v1/images/gc", nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ImageStats returns lazy-loading figures of one image on the node.
func (c *Client) ImageStats(ctx context.Context, ref string) (*ImageStats, error) {
	if err := need("image reference", ref); err != nil {
		return nil, err
	}
	var out ImageStats
	if err := c.call(ctx, http.MethodGet, imagePath(ref, "/stats"), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
