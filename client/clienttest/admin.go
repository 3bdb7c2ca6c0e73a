package clienttest

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"github.com/dsec-dev/dsec/internal/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
)

func needAdmin(c api.Caller) error {
	if !c.Admin {
		return fmt.Errorf("tenant %s is not an admin: %w", c.Tenant, errdefs.ErrPermissionDenied)
	}
	return nil
}

// ImportImage implements api.Service. A path import checks that the path
// exists on this host; an upload reads the whole stream and reports
// progress every 64 KiB.
func (s *Service) ImportImage(ctx context.Context, c api.Caller, ref, path string, r io.Reader, public bool, progress func(api.ImportProgress)) (*api.ImageInfo, error) {
	if ref == "" {
		return nil, fmt.Errorf("image reference is required: %w", errdefs.ErrInvalidArgument)
	}
	var size int64
	start := time.Now()
	switch {
	case r != nil:
		buf := make([]byte, 64<<10)
		for {
			n, err := r.Read(buf)
			size += int64(n)
			if n > 0 && progress != nil {
				rate := int64(float64(size) / max(time.Since(start).Seconds(), 1e-6))
				progress(api.ImportProgress{Layer: 1, Layers: 1, Bytes: size, BytesPerSec: rate})
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("read upload: %w", err)
			}
		}
		if size == 0 {
			return nil, fmt.Errorf("empty upload: %w", errdefs.ErrInvalidArgument)
		}
	case path != "":
		if err := needAdmin(c); err != nil {
			return nil, err
		}
		st, err := os.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("import path: %v: %w", err, errdefs.ErrNotFound)
		}
		size = st.Size()
	default:
		return nil, fmt.Errorf("import needs a path or a tar stream: %w", errdefs.ErrInvalidArgument)
	}
	if progress != nil {
		progress(api.ImportProgress{Layer: 1, Layers: 1, Bytes: size, Done: true})
	}
	ref = normRef(ref)
	img := &api.ImageInfo{Name: ref, Digest: "sha256:" + newID(32), Layers: []string{"sha256:" + newID(32)}, Size: size, Owner: c.Tenant, Public: public, CreatedAt: time.Now()}
	s.mu.Lock()
	s.images[ref] = img
	s.mu.Unlock()
	out := *img
	return &out, nil
}

func (s *Service) image(c api.Caller, ref string) (*api.ImageInfo, error) {
	img, ok := s.images[normRef(ref)]
	if !ok || (!img.Public && !c.Admin && img.Owner != c.Tenant) {
		return nil, fmt.Errorf("image %s: %w", ref, errdefs.ErrNotFound)
	}
	return img, nil
}

// ListImages implements api.Service.
func (s *Service) ListImages(ctx context.Context, c api.Caller) ([]api.ImageInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []api.ImageInfo{}
	for ref := range s.images {
		if img, err := s.image(c, ref); err == nil {
			out = append(out, *img)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// GetImage implements api.Service.
func (s *Service) GetImage(ctx context.Context, c api.Caller, ref string) (*api.ImageInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, err := s.image(c, ref)
	if err != nil {
		return nil, err
	}
	out := *img
	return &out, nil
}

// RemoveImage implements api.Service.
func (s *Service) RemoveImage(ctx context.Context, c api.Caller, ref string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, err := s.image(c, ref)
	if err != nil {
		return err
	}
	if !c.Admin && img.Owner != c.Tenant {
		return fmt.Errorf("image %s belongs to %s: %w", ref, img.Owner, errdefs.ErrPermissionDenied)
	}
	delete(s.images, img.Name)
	return nil
}

// GCImages implements api.Service.
func (s *Service) GCImages(ctx context.Context, c api.Caller) (*api.GCResult, error) {
	if err := needAdmin(c); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return &api.GCResult{KeptBlobs: len(s.images)}, nil
}

// ImageStats implements api.Service.
func (s *Service) ImageStats(ctx context.Context, c api.Caller, ref string) (*api.ImageStats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, err := s.image(c, ref)
	if err != nil {
		return nil, err
	}
	return &api.ImageStats{Image: img.Name, ImageBytes: img.Size}, nil
}

// Authenticate implements api.Service.
func (s *Service) Authenticate(ctx context.Context, secret string) (api.Caller, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tokens[secret]
	if !ok || t.Revoked {
		return api.Caller{}, fmt.Errorf("unknown or revoked token: %w", errdefs.ErrUnauthenticated)
	}
	ten := s.tenants[t.Tenant]
	return api.Caller{Tenant: t.Tenant, Admin: ten != nil && ten.Admin, TokenID: t.ID}, nil
}

// CreateTenant implements api.Service.
func (s *Service) CreateTenant(ctx context.Context, c api.Caller, t api.Tenant) (*api.Tenant, error) {
	if err := needAdmin(c); err != nil {
		return nil, err
	}
	if t.Name == "" {
		return nil, fmt.Errorf("tenant name is required: %w", errdefs.ErrInvalidArgument)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.tenants[t.Name]; ok {
		return nil, fmt.Errorf("tenant %s: %w", t.Name, errdefs.ErrAlreadyExists)
	}
	t.CreatedAt = time.Now()
	s.tenants[t.Name] = &t
	out := t
	return &out, nil
}

// ListTenants implements api.Service.
func (s *Service) ListTenants(ctx context.Context, c api.Caller) ([]api.Tenant, error) {
	if err := needAdmin(c); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []api.Tenant{}
	for _, t := range s.tenants {
		out = append(out, *t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// DeleteTenant implements api.Service.
func (s *Service) DeleteTenant(ctx context.Context, c api.Caller, name string) error {
	if err := needAdmin(c); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.tenants[name]; !ok {
		return fmt.Errorf("tenant %s: %w", name, errdefs.ErrNotFound)
	}
	delete(s.tenants, name)
	return nil
}

// CreateToken implements api.Service.
func (s *Service) CreateToken(ctx context.Context, c api.Caller, tenant string, opts ...api.TokenOption) (*api.Token, error) {
	if err := needAdmin(c); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.tenants[tenant]; !ok {
		return nil, fmt.Errorf("tenant %s: %w", tenant, errdefs.ErrNotFound)
	}
	t := &api.Token{ID: "tok-" + newID(8), Tenant: tenant, CreatedAt: time.Now(), Secret: "dsec_" + newID(32)}
	s.tokens[t.Secret] = t
	out := *t
	return &out, nil
}

// RevokeToken implements api.Service.
func (s *Service) RevokeToken(ctx context.Context, c api.Caller, id string) error {
	if err := needAdmin(c); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.tokens {
		if t.ID == id {
			t.Revoked = true
			return nil
		}
	}
	return fmt.Errorf("token %s: %w", id, errdefs.ErrNotFound)
}

// NodeInfo implements api.Service with synthetic figures.
func (s *Service) NodeInfo(ctx context.Context, c api.Caller) ([]node.NodeInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ni := node.NodeInfo{Name: "fake-node", CPUs: NodeCPUs, MemoryBytes: NodeMemoryBytes, CgroupVersion: 1}
	for _, sb := range s.sandboxes {
		ni.Sandboxes++
		ni.CPURequested += sb.sb.Spec.CPU
		ni.MemoryHeldBytes += MemPerSandbox
	}
	ni.MemAvailable = NodeMemAvailable - int64(ni.Sandboxes)*MemPerSandbox
	return []node.NodeInfo{ni}, nil
}

// Capacity implements api.Service: fits by CPU request and memory limit.
func (s *Service) Capacity(ctx context.Context, c api.Caller, shape node.SandboxSpec) (*node.Capacity, error) {
	if shape.CPU <= 0 || shape.MemoryBytes <= 0 {
		return nil, fmt.Errorf("shape needs cpu and memory: %w", errdefs.ErrInvalidArgument)
	}
	nis, _ := s.NodeInfo(ctx, c)
	ni := nis[0]
	byCPU := int((float64(ni.CPUs) - ni.CPURequested) / shape.CPU)
	byMem := int(ni.MemAvailable / shape.MemoryBytes)
	cp := &node.Capacity{Fits: byCPU, LimitingResource: "cpu", Detail: map[string]int{"cpu": byCPU, "memory": byMem}}
	if byMem < byCPU {
		cp.Fits, cp.LimitingResource = byMem, "memory"
	}
	return cp, nil
}

var rootCaller = api.AdminCaller

// AdminToken creates a token of the admin tenant and returns its secret,
// for TCP servers that require auth.
func (s *Service) AdminToken() string {
	t, err := s.CreateToken(context.Background(), rootCaller, api.AdminTenant)
	if err != nil {
		panic(err) // root always exists
	}
	return t.Secret
}
