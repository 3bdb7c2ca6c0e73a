//go:build linux

package sandboxfs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func benchRoot(b *testing.B) *Root {
	b.Helper()
	dir := b.TempDir()
	for i := range 100 {
		p := filepath.Join(dir, "home/user/project", fmt.Sprintf("file%03d.py", i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte("print('hi')\n"), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	r, err := OpenRoot(dir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	return r
}

func BenchmarkStat(b *testing.B) {
	r := benchRoot(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Stat("/home/user/project/file042.py"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkListDir100(b *testing.B) {
	r := benchRoot(b)
	b.ReportAllocs()
	for b.Loop() {
		fis, err := r.ListDir("/home/user/project", 1)
		if err != nil || len(fis) != 100 {
			b.Fatal(len(fis), err)
		}
	}
}

func BenchmarkWriteFile4K(b *testing.B) {
	r := benchRoot(b)
	data := strings.Repeat("x", 4096)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := r.WriteFile("/home/user/project/out.txt", 0o644, strings.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOpenRead4K(b *testing.B) {
	r := benchRoot(b)
	if _, err := r.WriteFile("/f", 0o644, strings.NewReader(strings.Repeat("x", 4096))); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 8192)
	b.ReportAllocs()
	for b.Loop() {
		rc, _, err := r.Open("/f")
		if err != nil {
			b.Fatal(err)
		}
		rc.Read(buf)
		rc.Close()
	}
}

// BenchmarkWriteFile4KNew writes a new name each time: no file is
// replaced, so ext4's flush-on-replace heuristic (auto_da_alloc) is not
// part of the figure.
func BenchmarkWriteFile4KNew(b *testing.B) {
	r := benchRoot(b)
	data := strings.Repeat("x", 4096)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	i := 0
	for b.Loop() {
		i++
		if _, err := r.WriteFile(fmt.Sprintf("/home/user/out/%d.txt", i), 0o644, strings.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}
