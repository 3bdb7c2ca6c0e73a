package image

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Pull fetches src (a registry reference such as
// registry.example:5000/team/img:tag) for linux/GOARCH and stores it as
// ref. Every blob is verified by digest as for OCI layouts. Credentials
// come from the docker config keychain.
func (s *Store) Pull(ctx context.Context, src, ref string, opts ...ImportOpt) (*Image, error) {
	ref, err := NormalizeRef(ref)
	if err != nil {
		return nil, err
	}
	var cfg importConfig
	for _, o := range opts {
		o(&cfg)
	}
	var nopts []name.Option
	if cfg.insecure {
		nopts = append(nopts, name.Insecure)
	}
	r, err := name.ParseReference(src, nopts...)
	if err != nil {
		return nil, fmt.Errorf("pull %q: %w: %w", src, errdefs.ErrInvalidArgument, err)
	}
	s.gcMu.RLock()
	defer s.gcMu.RUnlock()
	img, err := remote.Image(r,
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}),
	)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", src, remoteErr(err))
	}
	im, err := s.importV1(ctx, ref, img, "registry "+r.String(), true, cfg)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", src, remoteErr(err))
	}
	return im, nil
}

// remoteErr classifies registry errors by HTTP status.
func remoteErr(err error) error {
	var te *transport.Error
	if !errors.As(err, &te) {
		if errdefs.IsInvalidArgument(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
	}
	switch te.StatusCode {
	case http.StatusNotFound:
		return fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
	case http.StatusUnauthorized:
		return fmt.Errorf("%w: %w", errdefs.ErrUnauthenticated, err)
	case http.StatusForbidden:
		return fmt.Errorf("%w: %w", errdefs.ErrPermissionDenied, err)
	}
	return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
}
