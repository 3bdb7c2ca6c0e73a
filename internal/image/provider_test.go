package image

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testutil"
)

func TestUnpackProvider(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx := context.Background()
	s, bs := newTestStore(t)
	src := filepath.Join(t.TempDir(), "src")
	makeTree(t, src, false)
	d, _, err := s.BuildLayer(ctx, src)
	must(t, err)
	root := filepath.Join(t.TempDir(), "layers")
	p, err := NewUnpackProvider(root, bs, nil)
	must(t, err)

	var wg sync.WaitGroup
	paths := make([]string, 6)
	releases := make([]func(), 6)
	for i := range paths {
		wg.Go(func() {
			var err error
			paths[i], releases[i], err = p.Acquire(ctx, d)
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for _, pa := range paths {
		if pa != paths[0] {
			t.Fatalf("acquirers got different directories: %v", paths)
		}
	}
	compareTrees(t, src, paths[0])

	// Held: Prune keeps it.
	n, err := p.Prune(ctx)
	must(t, err)
	if n != 0 {
		t.Fatalf("Prune removed %d held layers", n)
	}
	for _, r := range releases {
		r()
		r() // idempotent
	}
	n, err = p.Prune(ctx)
	must(t, err)
	if n != 1 {
		t.Fatalf("Prune removed %d, want 1", n)
	}
	if _, err := os.Stat(paths[0]); !os.IsNotExist(err) {
		t.Fatalf("pruned layer still on disk: %v", err)
	}

	// A new provider on the same root reuses a completed directory.
	pa, rel, err := p.Acquire(ctx, d)
	must(t, err)
	rel()
	marker := filepath.Join(pa, "marker")
	must(t, os.WriteFile(marker, nil, 0o600))
	p2, err := NewUnpackProvider(root, bs, nil)
	must(t, err)
	pa2, rel2, err := p2.Acquire(ctx, d)
	must(t, err)
	defer rel2()
	if _, err := os.Stat(filepath.Join(pa2, "marker")); err != nil {
		t.Fatalf("existing unpacked layer not reused: %v", err)
	}

	// Missing layers fail cleanly and are retried later.
	missing := blob.FromBytes([]byte("no such layer"))
	if _, _, err := p.Acquire(ctx, missing); !errdefs.IsNotFound(err) {
		t.Fatalf("missing layer: %v", err)
	}
	if _, _, err := p.Acquire(ctx, missing); !errdefs.IsNotFound(err) {
		t.Fatalf("missing layer, second try: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(root, ".tmp")); len(ents) != 0 {
		t.Fatalf("failed unpack left %d temp dirs", len(ents))
	}
}

func overlaySupported() bool {
	b, err := os.ReadFile("/proc/filesystems")
	return err == nil && strings.Contains(string(b), "\toverlay\n")
}

func mountOverlay(t *testing.T, lower []string, upper, work, merged string) {
	t.Helper()
	opts := "lowerdir=" + strings.Join(lower, ":")
	if upper != "" {
		opts += ",upperdir=" + upper + ",workdir=" + work + ",redirect_dir=off,metacopy=off"
	}
	must(t, os.MkdirAll(merged, 0o755))
	must(t, unix.Mount("overlay", merged, "overlay", 0, opts))
	t.Cleanup(func() { unix.Unmount(merged, unix.MNT_DETACH) })
}

// TestCommitOverlayUpper commits the upper of a real overlay mount as a
// snapshot layer and mounts the result to check what a sandbox would see.
func TestCommitOverlayUpper(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresFeature(t, "overlayfs", overlaySupported())
	ctx := context.Background()
	s, bs := newTestStore(t)
	tmp := t.TempDir()
	base := filepath.Join(tmp, "base")
	writeFile(t, filepath.Join(base, "a/keep"), []byte("keep"), 0o644)
	writeFile(t, filepath.Join(base, "a/del"), []byte("del"), 0o644)
	writeFile(t, filepath.Join(base, "d/x"), []byte("x"), 0o644)
	writeFile(t, filepath.Join(base, "d/y"), []byte("y"), 0o644)
	writeFile(t, filepath.Join(base, "f"), []byte("old"), 0o644)
	baseIm, err := s.Import(ctx, "base:1", base)
	must(t, err)

	prov, err := NewUnpackProvider(filepath.Join(tmp, "layers"), bs, nil)
	must(t, err)
	lower, rel, err := prov.Acquire(ctx, baseIm.Manifest.Layers[0].Digest)
	must(t, err)
	defer rel()
	upper, work, merged := filepath.Join(tmp, "upper"), filepath.Join(tmp, "work"), filepath.Join(tmp, "merged")
	must(t, os.Mkdir(upper, 0o755))
	must(t, os.Mkdir(work, 0o755))
	mountOverlay(t, []string{lower}, upper, work, merged)
	// What a sandbox does.
	must(t, os.Remove(filepath.Join(merged, "a/del")))
	must(t, os.RemoveAll(filepath.Join(merged, "d")))
	must(t, os.Mkdir(filepath.Join(merged, "d"), 0o750))
	writeFile(t, filepath.Join(merged, "d/z"), []byte("z"), 0o644)
	writeFile(t, filepath.Join(merged, "f"), []byte("new content"), 0o644)
	writeFile(t, filepath.Join(merged, "n"), []byte("added"), 0o600)
	must(t, os.Chmod(filepath.Join(merged, "a/keep"), 0o600)) // metadata-only copy-up
	must(t, unix.Unmount(merged, 0))

	snap, err := s.CommitDir(ctx, "base:1", upper, "base:snap")
	must(t, err)
	if len(snap.Manifest.Layers) != 2 || snap.Manifest.Layers[0] != baseIm.Manifest.Layers[0] || snap.Manifest.Parent != baseIm.Digest {
		t.Fatalf("snapshot manifest: %+v", snap.Manifest)
	}
	ix, err := ReadIndex(ctx, bs, snap.Manifest.Layers[1].Digest)
	must(t, err)
	if e, ok := ix.Lookup("a/del"); !ok || !e.IsWhiteout() {
		t.Fatalf("deleted file not a whiteout: %+v", e)
	}
	if e, ok := ix.Lookup("d"); !ok || !e.IsOpaque() {
		t.Fatalf("recreated dir not opaque: %+v", e)
	}
	for _, e := range ix.Entries {
		for k := range e.Xattrs {
			if strings.HasPrefix(k, "trusted.overlay.") && k != XattrOpaque {
				t.Fatalf("%s: overlay bookkeeping xattr %s kept", e.Path, k)
			}
		}
	}

	// Mount the snapshot's layers read-only, as a sandbox from base:snap.
	top, rel2, err := prov.Acquire(ctx, snap.Manifest.Layers[1].Digest)
	must(t, err)
	defer rel2()
	view := filepath.Join(tmp, "view")
	mountOverlay(t, []string{top, lower}, "", "", view)
	want := map[string]string{"a/keep": "keep", "d/z": "z", "f": "new content", "n": "added"}
	for p, c := range want {
		b, err := os.ReadFile(filepath.Join(view, p))
		if err != nil || string(b) != c {
			t.Fatalf("%s = %q, %v; want %q", p, b, err, c)
		}
	}
	for _, p := range []string{"a/del", "d/x", "d/y"} {
		if _, err := os.Lstat(filepath.Join(view, p)); !os.IsNotExist(err) {
			t.Fatalf("%s visible in the snapshot: %v", p, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(view, "a/keep")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("chmod lost: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(view, "d")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Fatalf("recreated dir mode: %v %v", fi, err)
	}
}

// TestCommitRefusesRedirect: an upper holding a renamed directory
// (redirect xattr) cannot be committed faithfully, so it is refused.
func TestCommitRefusesRedirect(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx := context.Background()
	s, _ := newTestStore(t)
	base := t.TempDir()
	writeFile(t, filepath.Join(base, "x"), []byte("x"), 0o644)
	_, err := s.Import(ctx, "base:1", base)
	must(t, err)
	upper := t.TempDir()
	must(t, os.Mkdir(filepath.Join(upper, "moved"), 0o755))
	must(t, unix.Lsetxattr(filepath.Join(upper, "moved"), "trusted.overlay.redirect", []byte("/orig"), 0))
	if _, err := s.CommitDir(ctx, "base:1", upper, "base:2"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("CommitDir = %v, want failed precondition", err)
	}
	if _, err := s.Resolve(ctx, "base:2"); !errdefs.IsNotFound(err) {
		t.Fatalf("refused commit created a tag: %v", err)
	}
	if _, err := s.CommitDir(ctx, "nobase:1", upper, "base:3"); !errdefs.IsNotFound(err) {
		t.Fatalf("CommitDir on a missing base: %v", err)
	}
}
