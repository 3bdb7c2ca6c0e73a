package main

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testutil"
)

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		"/plain":            "/plain",
		`/with\040space`:    "/with space",
		`/tab\011and\134bs`: "/tab\tand\\bs",
		`/bad\9xx`:          `/bad\9xx`,
		`/short\04`:         `/short\04`,
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

// waitUnmounted reports a mount that stays, and returns once it is gone.
func TestWaitUnmounted(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	mnt := filepath.Join(dir, "layers", "a b")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(mnt, syscall.MNT_DETACH) })
	left, err := mountsBelow(filepath.Join(dir, "layers"))
	if err != nil || len(left) != 1 || left[0] != mnt {
		t.Fatalf("mountsBelow = %q, %v", left, err)
	}
	if err := waitUnmounted(context.Background(), filepath.Join(dir, "layers"), 100*time.Millisecond); !errdefs.IsUnavailable(err) {
		t.Fatalf("with a mount left: %v, want unavailable", err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = syscall.Unmount(mnt, 0)
	}()
	if err := waitUnmounted(context.Background(), filepath.Join(dir, "layers"), 5*time.Second); err != nil {
		t.Fatalf("after unmount: %v", err)
	}
}
