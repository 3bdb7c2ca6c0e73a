package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// DefaultAddr is where a local dsec server listens.
const DefaultAddr = "unix:///run/dsec/dsec.sock"

// Environment variables New falls back to.
const (
	EnvAddr  = "DSEC_ADDR"
	EnvToken = "DSEC_TOKEN"
)

// Client calls one dsec server. It is safe for concurrent use.
type Client struct {
	base  string // scheme://host, no trailing slash
	unix  string // socket path when the server is reached over a unix socket
	token string
	hc    *http.Client
	ua    string
}

type options struct {
	token    *string
	hc       *http.Client
	ua       string
	dialTime time.Duration
}

// Option configures a Client.
type Option func(*options) error

// WithToken sets the bearer token (default: $DSEC_TOKEN). An empty token
// sends no Authorization header.
func WithToken(token string) Option {
	return func(o *options) error { o.token = &token; return nil }
}

// WithHTTPClient replaces the HTTP client for tcp/http(s) addresses (for
// custom TLS or proxies). Unix-socket addresses always use their own
// transport.
func WithHTTPClient(hc *http.Client) Option {
	return func(o *options) error {
		if hc == nil {
			return fmt.Errorf("client: nil http client")
		}
		o.hc = hc
		return nil
	}
}

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option {
	return func(o *options) error { o.ua = ua; return nil }
}

// New returns a client for addr: unix:///path/to.sock, tcp://host:port,
// http://host:port or https://host:port. An empty addr means $DSEC_ADDR,
// then DefaultAddr.
func New(addr string, opts ...Option) (*Client, error) {
	o := options{ua: "dsec-go-client", dialTime: 10 * time.Second}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if addr == "" {
		addr = os.Getenv(EnvAddr)
	}
	if addr == "" {
		addr = DefaultAddr
	}
	c := &Client{ua: o.ua}
	if o.token != nil {
		c.token = *o.token
	} else {
		c.token = os.Getenv(EnvToken)
	}
	u, err := url.Parse(addr)
	if err != nil || u.Scheme == "" {
		return nil, fmt.Errorf("client: bad address %q: want unix:///path, tcp://host:port or http(s)://host:port", addr)
	}
	switch u.Scheme {
	case "unix":
		path := u.Path
		if path == "" {
			path = u.Opaque // unix:relative.sock
		}
		if u.Host != "" {
			path = u.Host + path // unix://relative/dir.sock
		}
		if path == "" {
			return nil, fmt.Errorf("client: bad address %q: no socket path", addr)
		}
		c.unix = path
		c.base = "http://dsec"
		d := net.Dialer{Timeout: o.dialTime}
		c.hc = &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return d.DialContext(ctx, "unix", path)
			},
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
		}}
	case "tcp", "http", "https":
		if u.Host == "" {
			return nil, fmt.Errorf("client: bad address %q: no host", addr)
		}
		scheme := u.Scheme
		if scheme == "tcp" {
			scheme = "http"
		}
		c.base = scheme + "://" + u.Host
		c.hc = o.hc
		if c.hc == nil {
			t := http.DefaultTransport.(*http.Transport).Clone()
			// Benchmarks and RL workers open many sandboxes at once.
			t.MaxIdleConnsPerHost = 64
			c.hc = &http.Client{Transport: t}
		}
	default:
		return nil, fmt.Errorf("client: bad address %q: unknown scheme %q", addr, u.Scheme)
	}
	return c, nil
}

// Local reports whether the server is reached over a unix socket, i.e. runs
// on this host and can read paths on it.
func (c *Client) Local() bool { return c.unix != "" }

// Addr returns the address in the form New accepts.
func (c *Client) Addr() string {
	if c.unix != "" {
		return "unix://" + c.unix
	}
	return c.base
}

func (c *Client) newRequest(ctx context.Context, method, path string, q url.Values, body io.Reader) (*http.Request, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("client: %s %s: %w", method, path, err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set("User-Agent", c.ua)
	req.Header.Set("Accept", "application/json")
	return req, nil
}

// send performs req and returns the response when it is 2xx; otherwise the
// body is read into an *Error and closed.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctxErr := req.Context().Err(); ctxErr != nil {
			return nil, ctxErr
		}
		return nil, fmt.Errorf("cannot reach dsec server at %s: %w", c.Addr(), err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, responseError(resp)
	}
	return resp, nil
}

// call sends in (JSON, when non-nil) and decodes the reply into out (when
// non-nil).
func (c *Client) call(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("client: encode %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := c.newRequest(ctx, method, path, q, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("client: decode reply of %s %s: %w", method, path, err)
	}
	return nil
}

// Health returns nil when GET /healthz succeeds.
func (c *Client) Health(ctx context.Context) error {
	return c.call(ctx, http.MethodGet, "/healthz", nil, nil, nil)
}

// esc escapes one path segment (ids, image refs with '/' or ':').
// download GETs raw bytes; the caller closes the response's body.
func (c *Client) download(ctx context.Context, path string, q url.Values) (*http.Response, error) {
	req, err := c.newRequest(ctx, http.MethodGet, path, q, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/octet-stream")
	return c.send(req)
}

func esc(s string) string { return url.PathEscape(s) }

func sandboxPath(id string, rest ...string) string {
	return "/v1/sandboxes/" + esc(id) + strings.Join(rest, "")
}

func decodeJSON(resp *http.Response, out any) error {
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("client: decode reply of %s %s: %w", resp.Request.Method, resp.Request.URL.Path, err)
	}
	return nil
}
