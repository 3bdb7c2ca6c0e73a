package main

import (
	"context"
	"errors"
	"log/slog"

	"github.com/dsec-dev/dsec/internal/api"
	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/runtime"
)

// newAdmission returns the node's admission policy (wired when the scheduler lands).
func newAdmission(cgroupVersion int, overcommit float64, s *node.StatsSampler) node.Admission {
	return nil
}

func startEfficiency(ctx context.Context, o *serveOptions, cg cgroups.Manager, agent *node.Local, rt runtime.Runtime, log *slog.Logger) (func(), error) {
	if o.swap != "" || o.reclaimIdle != 0 {
		return nil, errors.New("--swap and --reclaim-idle-after are not wired yet")
	}
	return func() {}, nil
}

func newE2BServer(svc api.Service, addr string, log *slog.Logger) (func(context.Context) error, error) {
	return nil, errors.New("--e2b-listen is not wired yet")
}
