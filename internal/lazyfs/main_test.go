package lazyfs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMain doubles as a helper process: with LAZYFS_MMAP_FILE set it prints
// the sha256 of the file read through a shared mapping. Page faults on a
// lazyfs file must come from another process than the daemon's: a faulting
// thread of the daemon's own process cannot be stopped by the Go garbage
// collector while it waits for the daemon, which then deadlocks.
func TestMain(m *testing.M) {
	if p := os.Getenv("LAZYFS_MMAP_FILE"); p != "" {
		os.Exit(mmapHash(p))
	}
	os.Exit(m.Run())
}

func mmapHash(p string) int {
	f, err := os.Open(p)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fi, err := f.Stat()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sum := sha256.Sum256(mem)
	fmt.Print(hex.EncodeToString(sum[:]))
	return 0
}
