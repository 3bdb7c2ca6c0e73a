package cgroups

import (
	"fmt"
	"path/filepath"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Detect picks the cgroup version in use under root (normally
// /sys/fs/cgroup):
//   - root itself is a cgroup2 mount (it has cgroup.controllers): v2;
//   - otherwise, v1 hierarchies at root/<controller>: v1. A hybrid host's
//     cgroup2 at root/unified is ignored, because the controllers dsec
//     needs are bound to v1 there (typically it holds none, or only hugetlb).
//
// Anything else is an error wrapping errdefs.ErrFailedPrecondition.
func Detect(root string, opts ...Option) (Manager, error) {
	if exists(filepath.Join(root, "cgroup.controllers")) {
		return NewV2(root, opts...)
	}
	if isDir(filepath.Join(root, "memory")) || isDir(filepath.Join(root, "cpu")) {
		return NewV1(root, opts...)
	}
	return nil, fmt.Errorf("cgroups: no cgroup v2 mount at %s and no v1 controllers under it: %w", root, errdefs.ErrFailedPrecondition)
}
