package layerd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Client talks to a daemon over its unix socket.
type Client struct {
	socket string
	hc     *http.Client
}

// NewClient returns a client of the daemon at socket.
func NewClient(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConnsPerHost: 64,
	}
	return &Client{socket: socket, hc: &http.Client{Transport: tr}}
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body bytes.Buffer
	if in != nil {
		if err := json.NewEncoder(&body).Encode(in); err != nil {
			return err
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://layerd"+path, &body)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("layer daemon at %s: %v: %w", c.socket, err, errdefs.ErrUnavailable)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var e struct{ Error, Code string }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		class := error(errdefs.ErrUnavailable)
		for _, cd := range codes {
			if cd.code == e.Code {
				class = cd.class
			}
		}
		return fmt.Errorf("layer daemon: %s: %w", e.Error, class)
	}
	if out != nil {
		return json.NewDecoder(resp.Body).Decode(out)
	}
	return nil
}

// Ping reports whether a daemon answers.
func (c *Client) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return c.do(ctx, http.MethodGet, "/healthz", nil, nil)
}

// Acquire leases layer for holder and returns its directory.
func (c *Client) Acquire(ctx context.Context, layer blob.Digest, holder string) (string, error) {
	var out struct{ Path string }
	if err := c.do(ctx, http.MethodPost, "/acquire", acquireReq{Layer: layer, Holder: holder}, &out); err != nil {
		return "", err
	}
	return out.Path, nil
}

// Release drops holder's lease on layer ("" = all of holder's leases).
func (c *Client) Release(ctx context.Context, layer blob.Digest, holder string) error {
	return c.do(ctx, http.MethodPost, "/release", acquireReq{Layer: layer, Holder: holder}, nil)
}

// Sync drops the leases of holders not in live.
func (c *Client) Sync(ctx context.Context, live []string) (int, error) {
	var out struct{ Dropped int }
	err := c.do(ctx, http.MethodPost, "/sync", live, &out)
	return out.Dropped, err
}

// Holders lists the holders with leases.
func (c *Client) Holders(ctx context.Context) ([]string, error) {
	var out []string
	err := c.do(ctx, http.MethodGet, "/holders", nil, &out)
	return out, err
}

// SetImage tells the daemon which layers make up image key (for stats).
func (c *Client) SetImage(ctx context.Context, key string, layers []blob.Digest) error {
	return c.do(ctx, http.MethodPost, "/images", imageReq{Key: key, Layers: layers}, nil)
}

// ImageStats returns the lazy-loading figures of image key.
func (c *Client) ImageStats(ctx context.Context, key string) (*Stats, error) {
	var st Stats
	if err := c.do(ctx, http.MethodGet, "/images/stats?key="+url.QueryEscape(key), nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// Quit asks the daemon to exit; without force it refuses while layers are leased.
func (c *Client) Quit(ctx context.Context, force bool) error {
	return c.do(ctx, http.MethodPost, fmt.Sprintf("/quit?force=%t", force), nil, nil)
}
