package rootfs_test

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/rootfs"
	"github.com/dsec-dev/dsec/internal/testutil"
)

func newPool(t testing.TB, opts ...rootfs.PoolOption) (*rootfs.DiskPool, string) {
	t.Helper()
	testutil.RequiresRoot(t)
	base := t.TempDir()
	p, err := rootfs.NewDiskPool(filepath.Join(base, "pool"), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, base
}

func isExt4(t *testing.T, img string) {
	t.Helper()
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [2]byte
	if _, err := f.ReadAt(b[:], 1024+0x38); err != nil {
		t.Fatal(err)
	}
	if binary.LittleEndian.Uint16(b[:]) != 0xEF53 {
		t.Fatalf("%s has no ext4 superblock", img)
	}
}

func TestPrepareWithoutDisk(t *testing.T) {
	lower := t.TempDir()
	dir := filepath.Join(t.TempDir(), "sb")
	l, err := rootfs.Prepare(context.Background(), dir, []string{lower}, 0, rootfs.Disks{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Disk != nil || l.Overlay.Upper != filepath.Join(dir, rootfs.UpperName) || l.Overlay.Work != filepath.Join(dir, rootfs.WorkName) {
		t.Fatalf("layout %+v", l)
	}
	for _, p := range []string{l.Root, l.Overlay.Upper, l.Overlay.Work} {
		if st, err := os.Stat(p); err != nil || !st.IsDir() {
			t.Fatalf("%s: %v", p, err)
		}
	}
	if _, err := rootfs.Prepare(context.Background(), dir, []string{lower}, 0, rootfs.Disks{}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second prepare: %v", err)
	}
	// What a sandbox leaves: files in upper, overlay's volatile marker.
	os.MkdirAll(filepath.Join(l.Overlay.Upper, "a/b"), 0o755)
	os.WriteFile(filepath.Join(l.Overlay.Upper, "a/b/f"), []byte("x"), 0o644)
	os.MkdirAll(filepath.Join(l.Overlay.Work, "work/incompat/volatile"), 0o755)
	os.WriteFile(filepath.Join(l.Overlay.Work, "work/incompat/volatile/dirty"), nil, 0o644)
	if err := rootfs.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatal("dir left")
	}
	if err := rootfs.Remove(dir); err != nil {
		t.Fatalf("removing a missing dir: %v", err)
	}
}

func TestPrepareInvalid(t *testing.T) {
	lower := t.TempDir()
	file := filepath.Join(lower, "file")
	os.WriteFile(file, nil, 0o644)
	base := t.TempDir()
	tests := []struct {
		name  string
		dir   string
		lower []string
		disk  int64
		class error
	}{
		{"relative dir", "sb", []string{lower}, 0, errdefs.ErrInvalidArgument},
		{"no lower", filepath.Join(base, "a"), nil, 0, errdefs.ErrInvalidArgument},
		{"relative lower", filepath.Join(base, "a"), []string{"x"}, 0, errdefs.ErrInvalidArgument},
		{"missing lower", filepath.Join(base, "a"), []string{"/nonexistent"}, 0, errdefs.ErrInvalidArgument},
		{"lower is a file", filepath.Join(base, "a"), []string{file}, 0, errdefs.ErrInvalidArgument},
		{"negative disk", filepath.Join(base, "a"), []string{lower}, -1, errdefs.ErrInvalidArgument},
		{"tiny disk", filepath.Join(base, "a"), []string{lower}, 4096, errdefs.ErrInvalidArgument},
		{"disk without pool", filepath.Join(base, "a"), []string{lower}, 64 << 20, errdefs.ErrFailedPrecondition},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := rootfs.Prepare(context.Background(), tc.dir, tc.lower, tc.disk, rootfs.Disks{})
			if !errors.Is(err, tc.class) {
				t.Fatalf("got %v want %v", err, tc.class)
			}
			if _, err := os.Stat(filepath.Join(base, "a")); !os.IsNotExist(err) {
				t.Fatal("failed prepare left its dir")
			}
		})
	}
	if err := rootfs.Remove("relative"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("remove relative: %v", err)
	}
}

func TestDiskPool(t *testing.T) {
	p, base := newPool(t, rootfs.WithPoolTarget(2))
	const size = 32 << 20
	// Empty pool: formatted inline.
	a := filepath.Join(base, "a.img")
	if err := p.Take(context.Background(), size, a); err != nil {
		t.Fatal(err)
	}
	isExt4(t, a)
	st, _ := os.Stat(a)
	if st.Size() != size {
		t.Fatalf("image size %d", st.Size())
	}
	// The image is sparse: mkfs wrote little.
	if st.Sys() != nil {
		if blocks := diskUsage(a); blocks > size/4 {
			t.Fatalf("image uses %d bytes on disk, not sparse", blocks)
		}
	}
	// The pool refills in the background.
	deadline := time.Now().Add(20 * time.Second)
	for p.Ready(size) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("pool did not refill: %d ready", p.Ready(size))
		}
		time.Sleep(20 * time.Millisecond)
	}
	b := filepath.Join(base, "b.img")
	if err := p.Take(context.Background(), size, b); err != nil {
		t.Fatal(err)
	}
	isExt4(t, b)
	if err := p.Take(context.Background(), 1024, filepath.Join(base, "c.img")); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("tiny size: %v", err)
	}
	if _, err := os.Stat(filepath.Join(base, "c.img")); !os.IsNotExist(err) {
		t.Fatal("refused take left a file")
	}
}

func TestLoopAttachAutoclear(t *testing.T) {
	p, base := newPool(t, rootfs.WithPoolTarget(0))
	_, err := os.Stat("/dev/loop-control")
	testutil.RequiresFeature(t, "loop devices", err == nil)
	img := filepath.Join(base, "d.img")
	if err := p.Take(context.Background(), 16<<20, img); err != nil {
		t.Fatal(err)
	}
	l, err := rootfs.AttachLoop(img)
	if err != nil {
		t.Fatal(err)
	}
	sysf := "/sys/block/" + filepath.Base(l.Path) + "/loop/backing_file"
	b, err := os.ReadFile(sysf)
	if err != nil || strings.TrimSpace(string(b)) != img {
		t.Fatalf("backing file %q %v", b, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(sysf)
		if err != nil || strings.TrimSpace(string(b)) != img {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("loop device not cleared after the last close")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := rootfs.AttachLoop(filepath.Join(base, "missing.img")); err == nil {
		t.Fatal("attached a missing image")
	}
}

// BenchmarkFormat measures mkfs of a sparse image (what the pool hides).
func BenchmarkFormat(b *testing.B) {
	p, base := newPool(b, rootfs.WithPoolTarget(0))
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		img := filepath.Join(base, "f.img")
		if err := p.Take(context.Background(), 1<<30, img); err != nil {
			b.Fatal(err)
		}
		os.Remove(img)
	}
}

// BenchmarkTakeWarm measures Take from a filled pool plus loop attach.
func BenchmarkTakeWarm(b *testing.B) {
	p, base := newPool(b, rootfs.WithPoolTarget(4))
	const size = 1 << 30
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		for p.Ready(size) == 0 {
			p.Warm(size)
			time.Sleep(5 * time.Millisecond)
		}
		img := filepath.Join(base, "t.img")
		b.StartTimer()
		if err := p.Take(context.Background(), size, img); err != nil {
			b.Fatal(err)
		}
		l, err := rootfs.AttachLoop(img)
		if err != nil {
			b.Fatal(err)
		}
		l.Close()
		b.StopTimer()
		os.Remove(img)
		b.StartTimer()
	}
}
