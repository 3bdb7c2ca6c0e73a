package image

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/dsec-dev/dsec/internal/blob"
)

// BenchmarkImportDir measures rootfs import throughput into a dir store:
// 32 MiB, half incompressible, half compressible, fresh store each time.
func BenchmarkImportDir(b *testing.B) {
	src := b.TempDir()
	writeFile(b, filepath.Join(src, "random"), randBytes(1, 16<<20), 0o644)
	text := make([]byte, 16<<20)
	for i := range text {
		text[i] = "abcdefgh\n"[i%9]
	}
	writeFile(b, filepath.Join(src, "text"), text, 0o644)
	b.SetBytes(32 << 20)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		s, _ := newTestStore(b)
		b.StartTimer()
		if _, err := s.Import(context.Background(), "bench", src); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadChunk measures a verified 1 MiB chunk read (the lazyfs
// miss path) from a dir store, raw and zstd.
func BenchmarkReadChunk(b *testing.B) {
	for _, kind := range []string{"raw", "zstd"} {
		b.Run(kind, func(b *testing.B) {
			bs, err := blob.NewDirStore(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			data := randBytes(2, DefaultChunkSize)
			if kind == "zstd" {
				for i := range data {
					data[i] &= 0x0f // compressible
				}
			}
			c, _, err := putChunk(context.Background(), bs, data, make([]byte, 0, len(data)), true)
			if err != nil {
				b.Fatal(err)
			}
			if (c.Stored != "") != (kind == "zstd") {
				b.Fatalf("chunk stored as %+v", c)
			}
			buf := make([]byte, 0, 2*DefaultChunkSize)
			b.SetBytes(DefaultChunkSize)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ReadChunk(context.Background(), bs, c, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
