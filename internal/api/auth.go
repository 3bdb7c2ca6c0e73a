package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/store"
)

// tokenRecord is a token as stored: never the secret, only its hash.
type tokenRecord struct {
	ID        string `json:"id"`
	Tenant    string `json:"tenant"`
	Hash      string `json:"hash"` // hex sha256 of the whole secret
	Prefix    string `json:"prefix"`
	CreatedAt string `json:"created_at"`
	Revoked   bool   `json:"revoked,omitempty"`
}

func (r *tokenRecord) token() *Token {
	t := &Token{ID: r.ID, Tenant: r.Tenant, Revoked: r.Revoked}
	_ = t.CreatedAt.UnmarshalText([]byte(r.CreatedAt))
	return t
}

const secretHexLen = 64 // 32 random bytes

func hashSecret(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

func unauthenticated(format string, a ...any) error {
	return fmt.Errorf(format+": %w", append(a, errdefs.ErrUnauthenticated)...)
}

// Authenticate implements Service. Secrets are looked up by their sha256,
// so the store never holds anything that authenticates by itself.
func (s *ControlPlane) Authenticate(ctx context.Context, secret string) (c Caller, err error) {
	defer func() {
		// Only failures are audited: successes are audited by the call.
		if err != nil {
			s.audit.Record(s.now(), Caller{}, "Authenticate", "", err)
		}
	}()
	prefix := ""
	for _, p := range []string{TokenPrefixNative, TokenPrefixE2B} {
		if strings.HasPrefix(secret, p) {
			prefix = p
		}
	}
	rest := strings.TrimPrefix(secret, prefix)
	if prefix == "" || len(rest) != secretHexLen {
		return Caller{}, unauthenticated("malformed token (want dsec_ or e2b_ followed by 64 hex digits)")
	}
	if _, err := hex.DecodeString(rest); err != nil {
		return Caller{}, unauthenticated("malformed token (want dsec_ or e2b_ followed by 64 hex digits)")
	}
	var id string
	if err := s.st.Get(ctx, store.BucketTokenHashes, hashSecret(secret), &id); err != nil {
		if errdefs.IsNotFound(err) {
			return Caller{}, unauthenticated("unknown token")
		}
		return Caller{}, err
	}
	var rec tokenRecord
	if err := s.st.Get(ctx, store.BucketTokens, id, &rec); err != nil {
		if errdefs.IsNotFound(err) {
			return Caller{}, unauthenticated("unknown token")
		}
		return Caller{}, err
	}
	if rec.Revoked {
		return Caller{}, unauthenticated("token %s is revoked", rec.ID)
	}
	var t Tenant
	if err := s.st.Get(ctx, store.BucketTenants, rec.Tenant, &t); err != nil {
		if errdefs.IsNotFound(err) {
			return Caller{}, unauthenticated("the tenant of token %s no longer exists", rec.ID)
		}
		return Caller{}, err
	}
	return Caller{Tenant: t.Name, Admin: t.Admin, TokenID: rec.ID}, nil
}

func requireAdmin(c Caller, what string) error {
	if !c.Admin {
		return fmt.Errorf("%s needs an admin caller: %w", what, errdefs.ErrPermissionDenied)
	}
	return nil
}

// CreateTenant implements Service (admin only).
func (s *ControlPlane) CreateTenant(ctx context.Context, c Caller, t Tenant) (_ *Tenant, err error) {
	defer s.done(c, "CreateTenant", nil, &err)
	if err := requireAdmin(c, "creating tenants"); err != nil {
		return nil, err
	}
	if err := validName("tenant name", t.Name); err != nil {
		return nil, err
	}
	q := t.Quota
	if q.Sandboxes < 0 || q.CPU < 0 || q.MemoryBytes < 0 || q.DiskBytes < 0 {
		return nil, invalid("quota values must not be negative (0 = unlimited)")
	}
	t.CreatedAt = s.now()
	err = s.st.Update(ctx, func(tx store.Tx) error {
		var old Tenant
		if err := tx.Get(ctx, store.BucketTenants, t.Name, &old); err == nil {
			return fmt.Errorf("tenant %s: %w", t.Name, errdefs.ErrAlreadyExists)
		} else if !errdefs.IsNotFound(err) {
			return err
		}
		return tx.Put(ctx, store.BucketTenants, t.Name, t)
	})
	if err != nil {
		return nil, err
	}
	return &t, nil
}

// ListTenants implements Service (admin only).
func (s *ControlPlane) ListTenants(ctx context.Context, c Caller) (_ []Tenant, err error) {
	defer s.done(c, "ListTenants", nil, &err)
	if err := requireAdmin(c, "listing tenants"); err != nil {
		return nil, err
	}
	ts, err := store.ListAll[Tenant](ctx, s.st, store.BucketTenants, "")
	if ts == nil {
		ts = []Tenant{}
	}
	return ts, err
}

// DeleteTenant implements Service (admin only). A tenant that still holds
// sandboxes cannot be deleted; its tokens go with it.
func (s *ControlPlane) DeleteTenant(ctx context.Context, c Caller, name string) (err error) {
	defer s.done(c, "DeleteTenant", nil, &err)
	if err := requireAdmin(c, "deleting tenants"); err != nil {
		return err
	}
	if err := validName("tenant name", name); err != nil {
		return err
	}
	if name == AdminTenant {
		return fmt.Errorf("the admin tenant cannot be deleted: %w", errdefs.ErrFailedPrecondition)
	}
	// No create reserves for this tenant meanwhile (see reserve).
	s.tenantMu.Lock()
	defer s.tenantMu.Unlock()
	return s.st.Update(ctx, func(tx store.Tx) error {
		var t Tenant
		if err := tx.Get(ctx, store.BucketTenants, name, &t); err != nil {
			if errdefs.IsNotFound(err) {
				return fmt.Errorf("tenant %s: %w", name, errdefs.ErrNotFound)
			}
			return err
		}
		// Every record, in any state, and the creates in flight.
		if n := s.index.sandboxesOf(name); n > 0 {
			return fmt.Errorf("tenant %s still has %d sandboxes; delete them first: %w", name, n, errdefs.ErrFailedPrecondition)
		}
		toks, err := store.ListAll[tokenRecord](ctx, tx, store.BucketTokens, "")
		if err != nil {
			return err
		}
		for _, tok := range toks {
			if tok.Tenant != name {
				continue
			}
			if err := tx.Delete(ctx, store.BucketTokens, tok.ID); err != nil {
				return err
			}
			if err := ignoreNotFound(tx.Delete(ctx, store.BucketTokenHashes, tok.Hash)); err != nil {
				return err
			}
		}
		return tx.Delete(ctx, store.BucketTenants, name)
	})
}

// CreateToken implements Service. Admins issue tokens for any tenant; a
// tenant may issue tokens for itself.
func (s *ControlPlane) CreateToken(ctx context.Context, c Caller, tenant string, opts ...TokenOption) (_ *Token, err error) {
	defer s.done(c, "CreateToken", nil, &err)
	o := tokenOptions{prefix: TokenPrefixNative}
	for _, opt := range opts {
		opt(&o)
	}
	if o.prefix != TokenPrefixNative && o.prefix != TokenPrefixE2B {
		return nil, invalid("token prefix %q: want %s or %s", o.prefix, TokenPrefixNative, TokenPrefixE2B)
	}
	if tenant == "" {
		tenant = c.Tenant
	}
	if err := validName("tenant name", tenant); err != nil {
		return nil, err
	}
	if !c.Admin && tenant != c.Tenant {
		return nil, fmt.Errorf("tenant %s: %w", tenant, errdefs.ErrNotFound)
	}
	secret := o.prefix + randHex(secretHexLen/2)
	now := s.now()
	rec := tokenRecord{ID: "tok-" + randHex(8), Tenant: tenant, Hash: hashSecret(secret), Prefix: o.prefix}
	if b, err := now.MarshalText(); err == nil {
		rec.CreatedAt = string(b)
	}
	err = s.st.Update(ctx, func(tx store.Tx) error {
		var t Tenant
		if err := tx.Get(ctx, store.BucketTenants, tenant, &t); err != nil {
			if errdefs.IsNotFound(err) {
				return fmt.Errorf("tenant %s: %w", tenant, errdefs.ErrNotFound)
			}
			return err
		}
		if err := tx.Put(ctx, store.BucketTokens, rec.ID, rec); err != nil {
			return err
		}
		return tx.Put(ctx, store.BucketTokenHashes, rec.Hash, rec.ID)
	})
	if err != nil {
		return nil, err
	}
	tok := rec.token()
	tok.Secret = secret
	return tok, nil
}

// RevokeToken implements Service. The token stays listed as revoked; its
// hash index goes, so it can never authenticate again.
func (s *ControlPlane) RevokeToken(ctx context.Context, c Caller, id string) (err error) {
	defer s.done(c, "RevokeToken", nil, &err)
	if err := validID("token id", id); err != nil {
		return err
	}
	return s.st.Update(ctx, func(tx store.Tx) error {
		var rec tokenRecord
		if err := tx.Get(ctx, store.BucketTokens, id, &rec); err != nil || (!c.Admin && rec.Tenant != c.Tenant) {
			if err == nil || errdefs.IsNotFound(err) {
				return fmt.Errorf("token %s: %w", id, errdefs.ErrNotFound)
			}
			return err
		}
		rec.Revoked = true
		if err := ignoreNotFound(tx.Delete(ctx, store.BucketTokenHashes, rec.Hash)); err != nil {
			return err
		}
		return tx.Put(ctx, store.BucketTokens, id, rec)
	})
}
