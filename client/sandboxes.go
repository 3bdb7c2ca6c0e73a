package client

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"sort"
	"time"

	"github.com/dsec-dev/dsec/internal/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// need rejects an empty identifier before it turns into a different route
// (an empty sandbox id would make GET /v1/sandboxes/ a list call).
func need(what, v string) error {
	if v == "" {
		return fmt.Errorf("%s must not be empty: %w", what, errdefs.ErrInvalidArgument)
	}
	return nil
}

// CreateSandbox creates a sandbox and returns it once it is ready.
func (c *Client) CreateSandbox(ctx context.Context, spec SandboxSpec) (*Sandbox, error) {
	if err := need("image", spec.Image); err != nil && spec.FromSandbox == "" {
		return nil, err
	}
	var sb Sandbox
	if err := c.call(ctx, http.MethodPost, "/v1/sandboxes", nil, spec, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// GetSandbox returns one sandbox.
func (c *Client) GetSandbox(ctx context.Context, id string) (*Sandbox, error) {
	if err := need("sandbox id", id); err != nil {
		return nil, err
	}
	var sb Sandbox
	if err := c.call(ctx, http.MethodGet, sandboxPath(id), nil, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// ListSandboxes lists the caller's sandboxes that carry all labels and, when
// state is not empty, are in that state.
func (c *Client) ListSandboxes(ctx context.Context, labels map[string]string, state string) ([]Sandbox, error) {
	q := url.Values{}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		q.Add("label", k+"="+labels[k])
	}
	if state != "" {
		q.Set("state", state)
	}
	var out []Sandbox
	if err := c.call(ctx, http.MethodGet, "/v1/sandboxes", q, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// DeleteSandbox deletes a sandbox and everything in it.
func (c *Client) DeleteSandbox(ctx context.Context, id string) error {
	if err := need("sandbox id", id); err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, sandboxPath(id), nil, nil, nil)
}

// Pause freezes every process of a sandbox.
func (c *Client) Pause(ctx context.Context, id string) error {
	if err := need("sandbox id", id); err != nil {
		return err
	}
	return c.call(ctx, http.MethodPost, sandboxPath(id, "/pause"), nil, nil, nil)
}

// Resume thaws a paused sandbox.
func (c *Client) Resume(ctx context.Context, id string) error {
	if err := need("sandbox id", id); err != nil {
		return err
	}
	return c.call(ctx, http.MethodPost, sandboxPath(id, "/resume"), nil, nil, nil)
}

// SetTimeout makes the sandbox expire d from now (E2B semantics). The wire
// carries whole seconds; d is rounded up so a short timeout never becomes 0.
func (c *Client) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	if err := need("sandbox id", id); err != nil {
		return err
	}
	if d <= 0 {
		return fmt.Errorf("timeout must be positive, got %s: %w", d, errdefs.ErrInvalidArgument)
	}
	secs := int64(math.Ceil(d.Seconds()))
	return c.call(ctx, http.MethodPost, sandboxPath(id, "/timeout"), nil,
		api.TimeoutRequest{TimeoutSeconds: &secs}, nil)
}

// Stats returns live resource figures of a sandbox.
func (c *Client) Stats(ctx context.Context, id string) (*SandboxStats, error) {
	if err := need("sandbox id", id); err != nil {
		return nil, err
	}
	var st SandboxStats
	if err := c.call(ctx, http.MethodGet, sandboxPath(id, "/stats"), nil, nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// SetNetwork replaces a sandbox's egress policy.
func (c *Client) SetNetwork(ctx context.Context, id string, p NetworkPolicy) error {
	if err := need("sandbox id", id); err != nil {
		return err
	}
	return c.call(ctx, http.MethodPut, sandboxPath(id, "/network"), nil, p, nil)
}

// Snapshot commits a sandbox's file system as image NAME[:TAG].
func (c *Client) Snapshot(ctx context.Context, id, imageRef string) (*ImageInfo, error) {
	if err := need("sandbox id", id); err != nil {
		return nil, err
	}
	if err := need("image reference", imageRef); err != nil {
		return nil, err
	}
	var info ImageInfo
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "/snapshot"), nil,
		api.SnapshotRequest{Image: imageRef}, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// Fork starts count new sandboxes from a copy of a sandbox's file system.
func (c *Client) Fork(ctx context.Context, id string, count int) ([]Sandbox, error) {
	if err := need("sandbox id", id); err != nil {
		return nil, err
	}
	if count < 1 {
		return nil, fmt.Errorf("fork count must be at least 1, got %d: %w", count, errdefs.ErrInvalidArgument)
	}
	var out []Sandbox
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "/fork"), nil,
		api.ForkRequest{Count: count}, &out); err != nil {
		return nil, err
	}
	return out, nil
}
