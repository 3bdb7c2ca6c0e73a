package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/store"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// imageACL is who owns an image name (all its tags) and whether every
// tenant may use it. Images without an entry (imported out of band, or
// hidden fork images) belong to the admin and are private.
type imageACL struct {
	Name   string `json:"name"` // NAME, without tag
	Owner  string `json:"owner"`
	Public bool   `json:"public,omitempty"`
}

func (s *ControlPlane) acl(ctx context.Context, r store.Reader, ref string) (imageACL, error) {
	name, _, err := parseRef(ref)
	if err != nil {
		return imageACL{}, err
	}
	var a imageACL
	err = r.Get(ctx, store.BucketImageACL, name, &a)
	if errdefs.IsNotFound(err) {
		return imageACL{Name: name, Owner: AdminTenant}, nil
	}
	return a, err
}

func canSee(a imageACL, tenant string, admin bool) bool {
	return admin || a.Public || a.Owner == tenant
}

func imageNotFound(ref string) error { return fmt.Errorf("image %s: %w", ref, errdefs.ErrNotFound) }

// checkImageUse fails with ErrNotFound unless tenant may use the image and
// (when an image manager is wired) it exists.
func (s *ControlPlane) checkImageUse(ctx context.Context, tenant string, admin bool, ref string) error {
	a, err := s.acl(ctx, s.st, ref)
	if err != nil {
		return err
	}
	if !canSee(a, tenant, admin) {
		return imageNotFound(ref)
	}
	if s.images != nil {
		if _, err := s.images.Resolve(ctx, ref); err != nil {
			return err
		}
	}
	return nil
}

// claimImageName makes tenant the owner of ref's name unless another
// tenant owns it. Names are shared by all tenants, so a taken name is a
// conflict (it does not say whose).
// The returned release undoes a claim this call made (for a failed import
// or snapshot); it does nothing if the name was already the tenant's.
func (s *ControlPlane) claimImageName(ctx context.Context, tenant, ref string, public bool) (release func(), err error) {
	name, _, err := parseRef(ref)
	if err != nil {
		return nil, err
	}
	created := false
	release = func() {
		if !created {
			return
		}
		if err := ignoreNotFound(s.st.Delete(context.WithoutCancel(ctx), store.BucketImageACL, name)); err != nil {
			s.log.Warn("releasing an image name", "name", name, "err", err)
		}
	}
	return release, s.st.Update(ctx, func(tx store.Tx) error {
		var a imageACL
		err := tx.Get(ctx, store.BucketImageACL, name, &a)
		switch {
		case errdefs.IsNotFound(err):
			if tenant != AdminTenant && s.images != nil {
				// An image without ACL entry is the admin's.
				if list, lerr := s.images.List(ctx); lerr == nil {
					for _, im := range list {
						if n, _, _ := parseRef(im.Name); n == name {
							return fmt.Errorf("image name %s is taken: %w", name, errdefs.ErrAlreadyExists)
						}
					}
				}
			}
			created = true
			return tx.Put(ctx, store.BucketImageACL, name, imageACL{Name: name, Owner: tenant, Public: public})
		case err != nil:
			return err
		case a.Owner != tenant:
			return fmt.Errorf("image name %s is taken: %w", name, errdefs.ErrAlreadyExists)
		case public && !a.Public:
			a.Public = true
			return tx.Put(ctx, store.BucketImageACL, name, a)
		}
		return nil
	})
}

func (s *ControlPlane) withACL(ctx context.Context, info *ImageInfo) (*ImageInfo, error) {
	a, err := s.acl(ctx, s.st, info.Name)
	if err != nil {
		return nil, err
	}
	out := *info
	out.Owner, out.Public = a.Owner, a.Public
	return &out, nil
}

func (s *ControlPlane) needImages() error {
	if s.images == nil {
		return fmt.Errorf("no image store is configured: %w", errdefs.ErrNotImplemented)
	}
	return nil
}

// ImportImage implements Service. Importing from a server path is for
// admins only: it reads the server's file system.
func (s *ControlPlane) ImportImage(ctx context.Context, c Caller, ref, path string, r io.Reader, public bool, progress func(ImportProgress)) (_ *ImageInfo, err error) {
	defer s.done(c, "ImportImage", nil, &err)
	if err := s.needImages(); err != nil {
		return nil, err
	}
	ref, err = normRef(ref)
	if err != nil {
		return nil, err
	}
	switch {
	case path != "" && r != nil:
		return nil, invalid("give either a server path or an uploaded tar, not both")
	case path == "" && r == nil:
		return nil, invalid("give a server path or an uploaded tar")
	case path != "":
		if err := requireAdmin(c, "importing from a server path"); err != nil {
			return nil, err
		}
		if err := validPath("path", path); err != nil {
			return nil, err
		}
	}
	if public && !c.Admin {
		return nil, fmt.Errorf("only admins publish public images: %w", errdefs.ErrPermissionDenied)
	}
	release, err := s.claimImageName(ctx, c.Tenant, ref, public)
	if err != nil {
		return nil, err
	}
	if progress == nil {
		progress = func(ImportProgress) {}
	}
	var info *ImageInfo
	if path != "" {
		info, err = s.images.ImportPath(ctx, ref, path, progress)
	} else {
		info, err = s.images.ImportTar(ctx, ref, r, progress)
	}
	if err != nil {
		release()
		return nil, err
	}
	return s.withACL(ctx, info)
}

// ListImages implements Service: the caller's images and public ones.
func (s *ControlPlane) ListImages(ctx context.Context, c Caller) (_ []ImageInfo, err error) {
	defer s.done(c, "ListImages", nil, &err)
	if err := s.needImages(); err != nil {
		return nil, err
	}
	all, err := s.images.List(ctx)
	if err != nil {
		return nil, err
	}
	out := []ImageInfo{}
	for i := range all {
		info, err := s.withACL(ctx, &all[i])
		if err != nil {
			return nil, err
		}
		if canSee(imageACL{Owner: info.Owner, Public: info.Public}, c.Tenant, c.Admin) {
			out = append(out, *info)
		}
	}
	return out, nil
}

// GetImage implements Service.
func (s *ControlPlane) GetImage(ctx context.Context, c Caller, ref string) (_ *ImageInfo, err error) {
	defer s.done(c, "GetImage", nil, &err)
	return s.visibleImage(ctx, c, ref)
}

func (s *ControlPlane) visibleImage(ctx context.Context, c Caller, ref string) (*ImageInfo, error) {
	if err := s.needImages(); err != nil {
		return nil, err
	}
	ref, err := normRef(ref)
	if err != nil {
		return nil, err
	}
	a, err := s.acl(ctx, s.st, ref)
	if err != nil {
		return nil, err
	}
	if !canSee(a, c.Tenant, c.Admin) {
		return nil, imageNotFound(ref)
	}
	info, err := s.images.Resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	return s.withACL(ctx, info)
}

// RemoveImage implements Service: owners and admins only. A public image
// of another tenant is visible but not removable.
func (s *ControlPlane) RemoveImage(ctx context.Context, c Caller, ref string) (err error) {
	defer s.done(c, "RemoveImage", nil, &err)
	info, err := s.visibleImage(ctx, c, ref)
	if err != nil {
		return err
	}
	if !c.Admin && info.Owner != c.Tenant {
		return fmt.Errorf("image %s belongs to another tenant: %w", info.Name, errdefs.ErrPermissionDenied)
	}
	if err := s.images.Remove(ctx, info.Name); err != nil {
		return err
	}
	// The ACL is per name: drop it once the last tag is gone.
	name, _, _ := parseRef(info.Name)
	all, err := s.images.List(ctx)
	if err != nil {
		return nil
	}
	for _, im := range all {
		if n, _, _ := parseRef(im.Name); n == name {
			return nil
		}
	}
	return ignoreNotFound(s.st.Delete(ctx, store.BucketImageACL, name))
}

// GCImages implements Service (admin only: it affects everyone).
func (s *ControlPlane) GCImages(ctx context.Context, c Caller) (_ *GCResult, err error) {
	defer s.done(c, "GCImages", nil, &err)
	if err := requireAdmin(c, "image garbage collection"); err != nil {
		return nil, err
	}
	if err := s.needImages(); err != nil {
		return nil, err
	}
	return s.images.GC(ctx)
}

// ImageStats implements Service.
func (s *ControlPlane) ImageStats(ctx context.Context, c Caller, ref string) (_ *ImageStats, err error) {
	defer s.done(c, "ImageStats", nil, &err)
	info, err := s.visibleImage(ctx, c, ref)
	if err != nil {
		return nil, err
	}
	return s.images.Stats(ctx, info.Name)
}

var _ Puller = (*ControlPlane)(nil)

// PullImage implements Puller.
func (s *ControlPlane) PullImage(ctx context.Context, c Caller, ref string, public bool, progress func(ImportProgress)) (_ *ImageInfo, err error) {
	defer s.done(c, "PullImage", nil, &err)
	if err := s.needImages(); err != nil {
		return nil, err
	}
	p, ok := s.images.(ImagePuller)
	if !ok {
		return nil, fmt.Errorf("this image store cannot pull: %w", errdefs.ErrNotImplemented)
	}
	if err := requireAdmin(c, "pulling from a registry"); err != nil {
		return nil, err
	}
	local, err := pullName(ref)
	if err != nil {
		return nil, err
	}
	release, err := s.claimImageName(ctx, c.Tenant, local, public)
	if err != nil {
		return nil, err
	}
	if progress == nil {
		progress = func(ImportProgress) {}
	}
	info, err := p.Pull(ctx, ref, local, progress)
	if err != nil {
		release()
		return nil, err
	}
	return s.withACL(ctx, info)
}

// pullName is the local NAME:TAG of a registry reference: its repository
// path without the registry host (and without Docker Hub's "library/"),
// with its tag; a digest reference is tagged sha256-<12 hex>.
func pullName(ref string) (string, error) {
	if ref == "" || len(ref) > 1024 {
		return "", invalid("pull reference %q: want [REGISTRY/]NAME[:TAG|@DIGEST]", ref)
	}
	rest, tag := ref, ""
	if n, d, ok := strings.Cut(ref, "@"); ok {
		hexPart, found := strings.CutPrefix(d, "sha256:")
		if !found || len(hexPart) < 12 {
			return "", invalid("pull reference %q: bad digest", ref)
		}
		rest, tag = n, "sha256-"+hexPart[:12]
	}
	if i := strings.LastIndexByte(rest, ':'); i > strings.LastIndexByte(rest, '/') {
		if tag == "" {
			tag = rest[i+1:]
		}
		rest = rest[:i]
	}
	hub := true
	if first, after, ok := strings.Cut(rest, "/"); ok && (strings.ContainsAny(first, ".:") || first == "localhost") {
		rest = after
		hub = first == "docker.io" || first == "index.docker.io" || first == "registry-1.docker.io"
	}
	if hub {
		rest = strings.TrimPrefix(rest, "library/")
	}
	if tag == "" {
		tag = "latest"
	}
	return normRef(rest + ":" + tag)
}
