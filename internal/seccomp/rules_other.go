//go:build linux && !amd64

package seccomp

import (
	"fmt"
	"runtime"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// DefaultFilter has only an x86_64 profile so far; syscall numbers and
// the arch check differ per architecture.
func DefaultFilter(opts Options) (Filter, error) {
	return nil, fmt.Errorf("seccomp: no default profile for %s: %w", runtime.GOARCH, errdefs.ErrNotImplemented)
}
