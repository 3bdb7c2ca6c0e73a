// Package testutil gates tests on privileges and kernel features.
//
// CI runs as root with DSEC_REQUIRE_ROOT=1: there a test that would skip for
// lack of root fails instead, so a green CI never hides skipped root tests.
// Only a missing kernel feature may skip, and says which.
package testutil

import (
	"os"
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
