package client

import (
	"context"
	"net/http"

	"github.com/dsec-dev/dsec/internal/api"
)

// CreateTenant creates a tenant with its quota (admin only).
func (c *Client) CreateTenant(ctx context.Context, t Tenant) (*Tenant, error) {
	if err := need("tenant name", t.Name); err != nil {
		return nil, err
	}
	var out Tenant
	if err := c.call(ctx, http.MethodPost, "/v1/tenants", nil, t, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListTenants lists tenants (admin only).
func (c *Client) ListTenants(ctx context.Context) ([]Tenant, error) {
	var out []Tenant
	if err := c.call(ctx, http.MethodGet, "/v1/tenants", nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// DeleteTenant deletes a tenant (admin only).
func (c *Client) DeleteTenant(ctx context.Context, name string) error {
	if err := need("tenant name", name); err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, "/v1/tenants/"+esc(name), nil, nil, nil)
}

// TokenOptions are optional settings of CreateToken.
type TokenOptions struct {
	// E2B asks for an E2B-shaped API key ("e2b_..."), for the
	// E2B-compatible API.
	E2B bool
}

// CreateToken issues a token for tenant; Secret is set only in this reply.
func (c *Client) CreateToken(ctx context.Context, tenant string, opts TokenOptions) (*Token, error) {
	if err := need("tenant name", tenant); err != nil {
		return nil, err
	}
	body := api.TokenRequest{Tenant: tenant}
	if opts.E2B {
		body.Prefix = api.TokenPrefixE2B
	}
	var out Token
	if err := c.call(ctx, http.MethodPost, "/v1/tokens", nil, body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RevokeToken revokes a token by id.
func (c *Client) RevokeToken(ctx context.Context, id string) error {
	if err := need("token id", id); err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, "/v1/tokens/"+esc(id), nil, nil, nil)
}

// Nodes describes every node and what it has left.
func (c *Client) Nodes(ctx context.Context) ([]NodeInfo, error) {
	var out []NodeInfo
	if err := c.call(ctx, http.MethodGet, "/v1/nodes", nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// Capacity answers how many more sandboxes of shape fit.
func (c *Client) Capacity(ctx context.Context, shape SandboxSpec) (*Capacity, error) {
	var out Capacity
	if err := c.call(ctx, http.MethodPost, "/v1/capacity", nil, shape, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
