package lazyfs

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

const benchFileSize = 64 << 20

// readAll reads p with 1 MiB reads; cold drops its page cache (and the
// backing file's, if any) first so the read goes to the disk.
func readAll(b *testing.B, p string, cold bool, backing string) {
	f, err := os.Open(p)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if cold {
		for _, q := range []string{p, backing} {
			if q == "" {
				continue
			}
			g, err := os.Open(q)
			if err != nil {
				b.Fatal(err)
			}
			unix.Fadvise(int(g.Fd()), 0, 0, unix.FADV_DONTNEED)
			g.Close()
		}
	}
	buf := make([]byte, 1<<20)
	n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, buf)
	if err != nil || n != benchFileSize {
		b.Fatalf("read %d bytes: %v", n, err)
	}
}

// BenchmarkSequentialRead compares reading a large file whose chunks are
// all in the node cache through the layer (directly and through an overlay
// as a sandbox sees it) with reading the same file on the local disk.
func BenchmarkSequentialRead(b *testing.B) {
	for _, pt := range []bool{true, false} {
		e := newEnv(b, nil, 1<<30, WithPassthrough(pt))
		src := b.TempDir()
		writeFile(b, filepath.Join(src, "big"), randData(70, benchFileSize), 0o644)
		d, _ := buildLayer(b, e.store, src, 1<<20)
		dir, release, err := e.m.Acquire(context.Background(), d)
		if err != nil {
			b.Fatal(err)
		}
		readAll(b, filepath.Join(dir, "big"), false, "")
		release() // remount: the file is now fully cached
		layer := e.acquire(b, d)
		merged := mountOverlay(b, layer)
		backing := ""
		if pt {
			// Opening once assembles the whole-file copy in the cache.
			readAll(b, filepath.Join(layer, "big"), false, "")
			files, _ := filepath.Glob(filepath.Join(e.cache.dir, "files", "*"))
			if len(files) != 1 {
				b.Fatalf("no passthrough backing file: %v", files)
			}
			backing = files[0]
		}
		mode := map[bool]string{true: "passthrough", false: "daemon"}[pt]
		for _, cold := range []bool{false, true} {
			temp := map[bool]string{false: "warm", true: "cold"}[cold]
			if pt {
				b.Run("direct/"+temp, func(b *testing.B) {
					b.SetBytes(benchFileSize)
					for b.Loop() {
						readAll(b, filepath.Join(src, "big"), cold, "")
					}
				})
			}
			b.Run(mode+"/layer/"+temp, func(b *testing.B) {
				b.SetBytes(benchFileSize)
				for b.Loop() {
					readAll(b, filepath.Join(layer, "big"), cold, backing)
				}
			})
			b.Run(mode+"/overlay/"+temp, func(b *testing.B) {
				b.SetBytes(benchFileSize)
				for b.Loop() {
					readAll(b, filepath.Join(merged, "big"), cold, backing)
				}
			})
		}
	}
}

// BenchmarkStatReaddir walks a tree of many small files (readdir + lstat
// of every entry) on the local disk, on the layer and through an overlay.
func BenchmarkStatReaddir(b *testing.B) {
	e := newEnv(b, nil, 1<<30)
	src := b.TempDir()
	for i := range 50 {
		for j := range 100 {
			writeFile(b, filepath.Join(src, fmt.Sprintf("pkg%02d/mod%03d.py", i, j)), []byte("x = 1\n"), 0o644)
		}
	}
	d, _ := buildLayer(b, e.store, src, 1<<20)
	layer := e.acquire(b, d)
	merged := mountOverlay(b, layer)
	// A sandbox root without lazyfs would be an overlay on a disk dir.
	diskOverlay := mountOverlay(b, src)
	walk := func(b *testing.B, root string) {
		n := 0
		err := filepath.WalkDir(root, func(p string, de os.DirEntry, err error) error {
			if err == nil {
				_, err = de.Info()
				n++
			}
			return err
		})
		if err != nil || n != 5051 {
			b.Fatalf("walked %d entries: %v", n, err)
		}
	}
	for _, c := range []struct{ name, root string }{{"direct", src}, {"layer", layer}, {"overlay-on-disk", diskOverlay}, {"overlay-on-layer", merged}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			walk(b, c.root) // warm the dentry and attribute caches
			for b.Loop() {
				walk(b, c.root)
			}
		})
	}
}
