package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/testutil"
)

func TestOpenSandboxDisksFlags(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	tests := []struct {
		name, disks, size string
		usage             bool
	}{
		{"unknown mode", "zfs", "", true},
		{"bad size", "btrfs", "lots", true},
		{"loop needs no btrfs", "loop", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := &serveOptions{dataDir: t.TempDir(), disks: tc.disks, diskFSSize: tc.size}
			sv, err := openSandboxDisks(context.Background(), o, log)
			var ue usageError
			if tc.usage != errors.As(err, &ue) {
				t.Fatalf("err %v, want usage error %v", err, tc.usage)
			}
			if sv != nil {
				t.Fatal("subvolumes opened")
			}
		})
	}
}

// auto falls back to per-sandbox loop disks when btrfs can't be set up
// (here: no mkfs.btrfs on PATH); btrfs asked for explicitly fails.
func TestOpenSandboxDisksFallback(t *testing.T) {
	testutil.RequiresRoot(t)
	t.Setenv("PATH", t.TempDir())
	for _, mode := range []string{"auto", "btrfs"} {
		o := &serveOptions{dataDir: t.TempDir(), disks: mode}
		sv, err := openSandboxDisks(context.Background(), o, slog.New(slog.DiscardHandler))
		if sv != nil {
			sv.Close()
			t.Fatalf("%s: subvolumes without mkfs.btrfs", mode)
		}
		if (mode == "auto") != (err == nil) {
			t.Fatalf("%s: err %v", mode, err)
		}
		if mode == "btrfs" && !strings.Contains(err.Error(), "mkfs.btrfs") {
			t.Fatalf("error does not name what is missing: %v", err)
		}
		// Nothing is left mounted on the private dir.
		var st, pst unix.Stat_t
		priv := filepath.Join(o.dataDir, "node", "private")
		if unix.Stat(priv, &st) == nil && unix.Stat(filepath.Dir(priv), &pst) == nil && st.Dev != pst.Dev {
			_ = unix.Unmount(priv, unix.MNT_DETACH)
			t.Fatalf("%s: left a mount", mode)
		}
		if _, err := os.Stat(filepath.Join(o.dataDir, "node", "private.img")); err == nil {
			t.Fatalf("%s: left an image", mode)
		}
	}
}
