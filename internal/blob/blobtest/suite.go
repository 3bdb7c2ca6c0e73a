// Package blobtest is the conformance suite every blob.Store backend runs.
package blobtest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Suite runs the conformance tests against stores made by newStore; each
// call must return a fresh, empty store (cleaned up through t.Cleanup).
func Suite(t *testing.T, newStore func(t *testing.T) blob.Store) {
	tests := map[string]func(*testing.T, blob.Store){
		"PutReadStat":        testPutReadStat,
		"ReadAtOffsets":      testReadAtOffsets,
		"EmptyBlob":          testEmptyBlob,
		"ExpectedDigest":     testExpectedDigest,
		"WrongDigest":        testWrongDigest,
		"PutExisting":        testPutExisting,
		"Missing":            testMissing,
		"MalformedDigest":    testMalformedDigest,
		"WalkDelete":         testWalkDelete,
		"Large":              testLarge,
		"ConcurrentSamePut":  testConcurrentSamePut,
		"CancelledPut":       testCancelledPut,
		"ReadAllDetectsSize": testReadAllVerifies,
	}
	for name, fn := range tests {
		t.Run(name, func(t *testing.T) { fn(t, newStore(t)) })
	}
}

func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func put(t *testing.T, s blob.Store, b []byte) blob.Info {
	t.Helper()
	info, err := s.Put(context.Background(), "", bytes.NewReader(b))
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	if info.Digest != blob.FromBytes(b) || info.Size != int64(len(b)) {
		t.Fatalf("Put returned %+v, want digest %s size %d", info, blob.FromBytes(b), len(b))
	}
	return info
}

func testPutReadStat(t *testing.T, s blob.Store) {
	ctx := context.Background()
	b := randBytes(1, 100_000)
	info := put(t, s, b)
	st, err := s.Stat(ctx, info.Digest)
	if err != nil || st.Size != int64(len(b)) || st.Digest != info.Digest {
		t.Fatalf("Stat = %+v, %v", st, err)
	}
	if st.ModTime.IsZero() {
		t.Fatalf("Stat: zero ModTime")
	}
	got, err := blob.ReadAll(ctx, s, info.Digest)
	if err != nil || !bytes.Equal(got, b) {
		t.Fatalf("ReadAll: %v (equal=%v)", err, bytes.Equal(got, b))
	}
}

func testReadAtOffsets(t *testing.T, s blob.Store) {
	ctx := context.Background()
	b := randBytes(2, 10_000)
	d := put(t, s, b).Digest
	cases := []struct {
		off, n  int
		wantN   int
		wantEOF bool
	}{
		{0, 10, 10, false},
		{9990, 10, 10, false},
		{5000, 100, 100, false},
		{9995, 10, 5, true},
		{10_000, 10, 0, true},
		{20_000, 10, 0, true},
	}
	for _, c := range cases {
		p := make([]byte, c.n)
		n, err := s.ReadAt(ctx, d, p, int64(c.off))
		if n != c.wantN {
			t.Errorf("ReadAt(off=%d,n=%d) = %d bytes, want %d (err %v)", c.off, c.n, n, c.wantN, err)
		}
		if c.wantEOF != (err == io.EOF) {
			t.Errorf("ReadAt(off=%d,n=%d) err = %v, want EOF=%v", c.off, c.n, err, c.wantEOF)
		}
		if n > 0 && !bytes.Equal(p[:n], b[c.off:c.off+n]) {
			t.Errorf("ReadAt(off=%d,n=%d) wrong bytes", c.off, c.n)
		}
	}
	if _, err := s.ReadAt(ctx, d, make([]byte, 1), -1); !errdefs.IsInvalidArgument(err) {
		t.Errorf("negative offset: %v, want invalid argument", err)
	}
}

func testEmptyBlob(t *testing.T, s blob.Store) {
	ctx := context.Background()
	d := put(t, s, nil).Digest
	st, err := s.Stat(ctx, d)
	if err != nil || st.Size != 0 {
		t.Fatalf("Stat empty = %+v, %v", st, err)
	}
	n, err := s.ReadAt(ctx, d, make([]byte, 4), 0)
	if n != 0 || err != io.EOF {
		t.Fatalf("ReadAt empty = %d, %v; want 0, EOF", n, err)
	}
}

func testExpectedDigest(t *testing.T, s blob.Store) {
	b := randBytes(3, 5000)
	info, err := s.Put(context.Background(), blob.FromBytes(b), bytes.NewReader(b))
	if err != nil || info.Digest != blob.FromBytes(b) || info.Size != 5000 {
		t.Fatalf("Put with expected digest = %+v, %v", info, err)
	}
}

func testWrongDigest(t *testing.T, s blob.Store) {
	ctx := context.Background()
	b := randBytes(4, 5000)
	wrong := blob.FromBytes([]byte("something else"))
	_, err := s.Put(ctx, wrong, bytes.NewReader(b))
	if !errors.Is(err, blob.ErrDigestMismatch) || !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Put with wrong digest: %v, want digest mismatch", err)
	}
	for _, d := range []blob.Digest{wrong, blob.FromBytes(b)} {
		if _, err := s.Stat(ctx, d); !errdefs.IsNotFound(err) {
			t.Fatalf("after failed Put, Stat(%s) = %v, want not found", d, err)
		}
	}
	if n := count(t, s); n != 0 {
		t.Fatalf("failed Put left %d blobs", n)
	}
}

func testPutExisting(t *testing.T, s blob.Store) {
	b := randBytes(5, 3000)
	put(t, s, b)
	put(t, s, b)
	info, err := s.Put(context.Background(), blob.FromBytes(b), bytes.NewReader(b))
	if err != nil || info.Size != 3000 {
		t.Fatalf("re-Put with digest = %+v, %v", info, err)
	}
	if n := count(t, s); n != 1 {
		t.Fatalf("%d blobs after putting one blob thrice", n)
	}
}

func testMissing(t *testing.T, s blob.Store) {
	ctx := context.Background()
	d := blob.FromBytes([]byte("never stored"))
	if _, err := s.Stat(ctx, d); !errdefs.IsNotFound(err) {
		t.Errorf("Stat missing: %v", err)
	}
	if _, err := s.ReadAt(ctx, d, make([]byte, 4), 0); !errdefs.IsNotFound(err) {
		t.Errorf("ReadAt missing: %v", err)
	}
	if err := s.Delete(ctx, d); !errdefs.IsNotFound(err) {
		t.Errorf("Delete missing: %v", err)
	}
}

func testMalformedDigest(t *testing.T, s blob.Store) {
	ctx := context.Background()
	for _, d := range []blob.Digest{"", "sha256:../../etc/passwd", "md5:abcd", "sha256:" + blob.Digest(bytes.Repeat([]byte("G"), 64))} {
		if _, err := s.Stat(ctx, d); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Stat(%q): %v, want invalid argument", d, err)
		}
		if _, err := s.ReadAt(ctx, d, make([]byte, 1), 0); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ReadAt(%q): %v, want invalid argument", d, err)
		}
		if err := s.Delete(ctx, d); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Delete(%q): %v, want invalid argument", d, err)
		}
	}
	if _, err := s.Put(ctx, "sha256:zz", bytes.NewReader(nil)); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Put malformed expected: %v", err)
	}
}

func count(t *testing.T, s blob.Store) int {
	t.Helper()
	n := 0
	if err := s.Walk(context.Background(), func(blob.Info) error { n++; return nil }); err != nil {
		t.Fatalf("Walk: %v", err)
	}
	return n
}

func testWalkDelete(t *testing.T, s blob.Store) {
	ctx := context.Background()
	want := map[blob.Digest]int64{}
	for i := range 20 {
		b := randBytes(uint64(100+i), 100+i)
		want[put(t, s, b).Digest] = int64(len(b))
	}
	got := map[blob.Digest]int64{}
	if err := s.Walk(ctx, func(i blob.Info) error { got[i.Digest] = i.Size; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("Walk found %d blobs, want %d", len(got), len(want))
	}
	for d, sz := range want {
		if got[d] != sz {
			t.Fatalf("Walk: %s size %d, want %d", d, got[d], sz)
		}
	}
	stop := errors.New("stop")
	if err := s.Walk(ctx, func(blob.Info) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("Walk did not return the callback's error: %v", err)
	}
	for d := range want {
		if err := s.Delete(ctx, d); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if _, err := s.Stat(ctx, d); !errdefs.IsNotFound(err) {
			t.Fatalf("Stat after Delete: %v", err)
		}
	}
	if n := count(t, s); n != 0 {
		t.Fatalf("%d blobs left after deleting all", n)
	}
}

func testLarge(t *testing.T, s blob.Store) {
	ctx := context.Background()
	b := randBytes(6, 9<<20+123) // bigger than in-memory spools
	info := put(t, s, b)
	p := make([]byte, 1<<20)
	n, err := s.ReadAt(ctx, info.Digest, p, 8<<20)
	if err != nil || n != len(p) || !bytes.Equal(p, b[8<<20:9<<20]) {
		t.Fatalf("ReadAt in large blob: n=%d err=%v", n, err)
	}
}

func testConcurrentSamePut(t *testing.T, s blob.Store) {
	b := randBytes(7, 256<<10)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			_, err := s.Put(context.Background(), blob.FromBytes(b), bytes.NewReader(b))
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Put: %v", err)
		}
	}
	got, err := blob.ReadAll(context.Background(), s, blob.FromBytes(b))
	if err != nil || !bytes.Equal(got, b) {
		t.Fatalf("after concurrent Puts: %v", err)
	}
}

func testCancelledPut(t *testing.T, s blob.Store) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := randBytes(8, 1000)
	if _, err := s.Put(ctx, "", bytes.NewReader(b)); err == nil {
		t.Fatalf("Put with cancelled context succeeded")
	}
	if n := count(t, s); n != 0 {
		t.Fatalf("cancelled Put left %d blobs", n)
	}
}

// testReadAllVerifies checks that ReadAll refuses a digest whose stored
// bytes differ; the backend-specific corruption is done by the caller's
// own tests, here only a missing blob is covered.
func testReadAllVerifies(t *testing.T, s blob.Store) {
	if _, err := blob.ReadAll(context.Background(), s, blob.FromBytes([]byte("x"))); !errdefs.IsNotFound(err) {
		t.Fatalf("ReadAll missing: %v", err)
	}
}
