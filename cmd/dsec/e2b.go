package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/dsec-dev/dsec/internal/api"
	"github.com/dsec-dev/dsec/internal/api/e2b"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// newE2BServer serves the E2B-compatible API (REST control plane and envd
// data plane on one origin) on addr, a tcp:// address, until ctx ends. The
// listener is opened here so a bad or busy address fails the start.
func newE2BServer(svc api.Service, addr string, log *slog.Logger) (func(context.Context) error, error) {
	if !strings.HasPrefix(addr, "tcp://") {
		return nil, fmt.Errorf("--e2b-listen %q: want tcp://host:port (the E2B SDK speaks HTTP over TCP): %w", addr, errdefs.ErrInvalidArgument)
	}
	l, err := api.Listen(addr)
	if err != nil {
		return nil, fmt.Errorf("--e2b-listen: %w", err)
	}
	elog := log.With("component", "e2b")
	h := e2b.NewHandler(svc, e2b.WithLogger(elog))
	srv := api.NewServer(h, elog)
	return func(ctx context.Context) error {
		defer h.Close()
		return srv.ServeListeners(ctx, l)
	}, nil
}
