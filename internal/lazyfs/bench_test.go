package lazyfs

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/blob"
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
		e.cache.settle()
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

// pythonLayer stores a layer made of the host's Python: interpreter,
// libraries, stdlib and dist-packages (about the size of a slim image).
func pythonLayer(b *testing.B) (*testStore, blob.Digest) {
	const py = "/usr/bin/python3.11"
	if _, err := os.Stat(py); err != nil {
		b.Skip("host has no " + py + " to build the image from")
	}
	src := b.TempDir()
	out, err := exec.Command("ldd", py).Output()
	if err != nil {
		b.Fatal(err)
	}
	paths := []string{py, "/usr/bin/python3", "/usr/lib/python3.11", "/usr/lib/python3/dist-packages"}
	for _, f := range strings.Fields(string(out)) {
		if strings.HasPrefix(f, "/") {
			paths = append(paths, f)
		}
	}
	for _, p := range paths {
		args := []string{"-a", "--parents", strings.TrimPrefix(p, "/"), src}
		if !strings.HasPrefix(p, "/usr/") {
			args[0] = "-L" // libraries: copy the file behind /lib symlinks
		}
		cp := exec.Command("cp", args...)
		cp.Dir = "/"
		if out, err := cp.CombinedOutput(); err != nil {
			b.Fatalf("cp %s: %v: %s", p, err, out)
		}
	}
	store := newTestStore(b)
	d, _ := buildLayer(b, store, src, 1<<20)
	return store, d
}

// runPython runs Python in root. The host's chroot binary execs it: a Go
// vfork child exec'ing a file served by this very process would deadlock
// against the garbage collector (the parent thread cannot be stopped while
// the child waits on the daemon).
func runPython(b *testing.B, root string) {
	cmd := exec.Command("chroot", root, "/usr/bin/python3", "-c", "import json; json.dumps({})")
	cmd.Env = []string{"PATH=/usr/bin", "PYTHONDONTWRITEBYTECODE=1"}
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("python in the sandbox root: %v: %s", err, out)
	}
}

// BenchmarkPythonImportJSON runs `python3 -c 'import json'` in a fresh
// sandbox root (an overlay on the layer) with an empty node cache and
// reports how much of the image it fetched, against the image size and
// against the bytes the daemon served to the kernel.
func BenchmarkPythonImportJSON(b *testing.B) {
	store, d := pythonLayer(b)
	var st, warm Stats
	for b.Loop() {
		e := newEnv(b, store, 1<<30, WithPrefetchWindow(-1))
		dir, release, err := e.m.Acquire(context.Background(), d)
		if err != nil {
			b.Fatal(err)
		}
		root := mountOverlay(b, dir)
		runPython(b, root)
		st, _ = e.m.LayerStats(d)
		if err := unix.Unmount(root, 0); err != nil {
			b.Fatal(err)
		}
		e.cache.settle()
		release()
		// A later sandbox on a fresh mount with the node cache warm: the
		// files read are whole in the cache and served by passthrough.
		runPython(b, mountOverlay(b, e.acquire(b, d)))
		after, _ := e.m.LayerStats(d)
		warm = Stats{FetchedBytes: after.FetchedBytes - st.FetchedBytes, ReadBytes: after.ReadBytes - st.ReadBytes}
	}
	b.ReportMetric(float64(warm.FetchedBytes)/(1<<20), "warm-fetched-MiB")
	b.ReportMetric(float64(warm.ReadBytes)/(1<<20), "warm-daemon-read-MiB")
	b.ReportMetric(float64(st.ImageBytes)/(1<<20), "image-MiB")
	b.ReportMetric(float64(st.FetchedBytes)/(1<<20), "fetched-MiB")
	b.ReportMetric(100*float64(st.FetchedBytes)/float64(st.ImageBytes), "fetched-%")
	b.ReportMetric(float64(st.FetchedBytes)/float64(st.ReadBytes), "fetched/read")
}

// BenchmarkSandboxesPageCache runs the same Python start in 100 sandbox
// roots over one layer mount and reports how much the kernel's page cache
// (Cached in /proc/meminfo, so other activity on the host adds noise) grew
// for all of them relative to the first one.
func BenchmarkSandboxesPageCache(b *testing.B) {
	store, d := pythonLayer(b)
	var first, all, firstOurs, allOurs int64
	for b.Loop() {
		e := newEnv(b, store, 1<<30, WithPrefetchWindow(-1))
		layer := e.acquire(b, d)
		roots := make([]string, 100)
		for i := range roots {
			roots[i] = mountOverlay(b, layer)
		}
		ours := func() int64 { return residentUnder(b, layer) + residentUnder(b, e.cache.dir) }
		start, startOurs := meminfoCached(b), ours()
		runPython(b, roots[0])
		first, firstOurs = meminfoCached(b)-start, ours()-startOurs
		for _, r := range roots[1:] {
			runPython(b, r)
		}
		all, allOurs = meminfoCached(b)-start, ours()-startOurs
	}
	// The same, counting only pages of the layer's files and the cache's
	// files (mincore), which other activity on the host cannot inflate.
	b.ReportMetric(float64(firstOurs)/(1<<20), "first-own-MiB")
	b.ReportMetric(float64(allOurs)/float64(firstOurs), "own-growth-ratio")
	b.ReportMetric(float64(first)/(1<<20), "first-MiB")
	b.ReportMetric(float64(all)/(1<<20), "all100-MiB")
	b.ReportMetric(float64(all)/float64(first), "growth-ratio")
}

// residentUnder sums the page cache bytes of the regular files under dir.
func residentUnder(b *testing.B, dir string) int64 {
	var total int64
	filepath.WalkDir(dir, func(p string, de os.DirEntry, err error) error {
		if err != nil || !de.Type().IsRegular() {
			return nil
		}
		if fi, err := de.Info(); err != nil || fi.Size() == 0 {
			return nil
		}
		res, _ := residentPages(b, p)
		total += int64(res) * int64(os.Getpagesize())
		return nil
	})
	return total
}
