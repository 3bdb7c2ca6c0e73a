// Package testutil gates tests on privileges and kernel features, and
// holds small helpers tests share.
//
// CI runs as root with DSEC_REQUIRE_ROOT=1: there a test that would skip for
// lack of root fails instead, so a green CI never hides skipped root tests.
// Only a missing kernel feature may skip, and says which.
package testutil

import (
	"bytes"
	"io"
	"os"
	"sync"
	"testing"
)

// RequiresRoot skips t when not running as root, or fails it when
// DSEC_REQUIRE_ROOT=1.
func RequiresRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("DSEC_REQUIRE_ROOT") == "1" {
		t.Fatalf("test needs root and DSEC_REQUIRE_ROOT=1 forbids skipping it")
	}
	t.Skip("test needs root")
}

// RequiresFeature skips t when a kernel feature is missing, naming it.
func RequiresFeature(t testing.TB, feature string, present bool) {
	t.Helper()
	if !present {
		t.Skipf("kernel feature missing: %s", feature)
	}
}

// SyncBuffer is a bytes.Buffer that goroutines may write while another
// reads it (a logger's output, a process's stdout).
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Bytes returns a copy of what was written so far.
func (b *SyncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

// Tee returns a writer that writes to w (none if nil) and keeps in b.
func (b *SyncBuffer) Tee(w io.Writer) io.Writer {
	if w == nil {
		return b
	}
	return io.MultiWriter(w, b)
}
