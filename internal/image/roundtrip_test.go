package image

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testutil"
)

// TestRoundTripOverlayDir: dir -> layer -> unpack keeps every attribute,
// and the index is in overlay form.
func TestRoundTripOverlayDir(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx := context.Background()
	for _, compress := range []bool{true, false} {
		t.Run(map[bool]string{true: "zstd", false: "raw"}[compress], func(t *testing.T) {
			s, _ := newTestStore(t, WithCompression(compress))
			src := filepath.Join(t.TempDir(), "src")
			makeTree(t, src, true)
			d, ix, err := s.BuildLayer(ctx, src)
			must(t, err)

			wh, ok := ix.Lookup("etc/removed")
			if !ok || !wh.IsWhiteout() {
				t.Fatalf("whiteout entry = %+v", wh)
			}
			op, ok := ix.Lookup("opaque")
			if !ok || !op.IsOpaque() {
				t.Fatalf("opaque entry = %+v", op)
			}
			sp, _ := ix.Lookup("sparse")
			if len(sp.Chunks) != 2 || sp.Size != 20<<20 {
				t.Fatalf("sparse file: %d chunks, size %d; want 2 chunks (holes are no chunks)", len(sp.Chunks), sp.Size)
			}
			link, _ := ix.Lookup("aa/link")
			if link.Type != TypeReg {
				t.Fatalf("first hardlink path in index order should carry the content, got %s", link.Type)
			}
			if l, _ := ix.Lookup("zz/target"); l.Type != TypeHardlink || l.Linkname != "aa/link" {
				t.Fatalf("zz/target = %+v, want hardlink to aa/link", l)
			}
			tool, _ := ix.Lookup("bin/tool")
			if tool.Mode&os.ModeSetuid == 0 || tool.Xattrs["security.capability"] == nil {
				t.Fatalf("bin/tool lost setuid or capability: %+v", tool)
			}
			text, _ := ix.Lookup("share/text")
			if compress && text.Chunks[0].Stored == "" {
				t.Fatalf("compressible chunk stored raw")
			}
			if !compress && text.Chunks[0].Stored != "" {
				t.Fatalf("compression off but chunk stored compressed")
			}
			dup, _ := ix.Lookup("share/dup")
			if dup.Chunks[0] != text.Chunks[0] {
				t.Fatalf("identical files do not share chunks")
			}

			out := filepath.Join(t.TempDir(), "out")
			must(t, Unpack(ctx, s.Blobs(), d, out))
			compareTrees(t, src, out)
			if b := blocks(t, filepath.Join(out, "sparse")); b > 2*(DefaultChunkSize/512)+64 {
				t.Fatalf("unpacked sparse file uses %d blocks: holes were filled", b)
			}

			// Rebuilding the unpacked tree gives the very same layer.
			d2, _, err := s.BuildLayer(ctx, out)
			must(t, err)
			if d2 != d {
				t.Fatalf("rebuild of unpacked tree: %s, want %s", d2, d)
			}
		})
	}
}

// TestRootfsDirImport: a rootfs directory import drops device nodes by
// default and keeps them with WithKeepDevices; 0/0 devices and
// trusted.overlay.* from a rootfs are data, not overlay markers.
func TestRootfsDirImport(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx := context.Background()
	src := t.TempDir()
	writeFile(t, filepath.Join(src, "etc/hostname"), []byte("x\n"), 0o644)
	must(t, os.MkdirAll(filepath.Join(src, "dev"), 0o755))
	must(t, unix.Mknod(filepath.Join(src, "dev/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(t, unix.Mknod(filepath.Join(src, "dev/zero0"), unix.S_IFCHR, 0))
	must(t, unix.Lsetxattr(filepath.Join(src, "etc"), XattrOpaque, []byte("y"), 0))

	for _, keep := range []bool{false, true} {
		s, _ := newTestStore(t, WithKeepDevices(keep))
		im, err := s.Import(ctx, "rootfs:v1", src)
		must(t, err)
		ix, err := ReadIndex(ctx, s.Blobs(), im.Manifest.Layers[0].Digest)
		must(t, err)
		null, ok := ix.Lookup("dev/null")
		if ok != keep {
			t.Fatalf("keep=%v: dev/null present=%v", keep, ok)
		}
		if keep && (null.Type != TypeChar || null.Devmajor != 1 || null.Devminor != 3) {
			t.Fatalf("dev/null = %+v", null)
		}
		if _, ok := ix.Lookup("dev/zero0"); ok {
			t.Fatalf("a 0/0 device in a rootfs became a whiteout")
		}
		if e, _ := ix.Lookup("etc"); e.IsOpaque() {
			t.Fatalf("trusted.overlay.opaque from a rootfs kept")
		}
	}
}

// TestCorruptChunk damages chunks in the store; readers must refuse them.
func TestCorruptChunk(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx := context.Background()
	s, bs := newTestStore(t)
	src := filepath.Join(t.TempDir(), "src")
	makeTree(t, src, false)
	d, ix, err := s.BuildLayer(ctx, src)
	must(t, err)
	for _, p := range []string{"share/text", "bin/tool"} { // compressed, raw
		e, _ := ix.Lookup(p)
		c := e.Chunks[0]
		if _, err := ReadChunk(ctx, bs, c, nil); err != nil {
			t.Fatalf("%s: healthy chunk: %v", p, err)
		}
		name := filepath.Join(bs.Root(), "sha256", c.Blob().Hex()[:2], c.Blob().Hex())
		data, err := os.ReadFile(name)
		must(t, err)
		data[len(data)/2] ^= 0x40
		must(t, os.Chmod(name, 0o644))
		must(t, os.WriteFile(name, data, 0o644))
		if _, err := ReadChunk(ctx, bs, c, make([]byte, 0, 2*MaxChunkSize)); !errors.Is(err, blob.ErrDigestMismatch) || !errdefs.IsInvalidArgument(err) {
			t.Fatalf("%s: corrupt chunk read: %v, want digest mismatch", p, err)
		}
	}
	err = Unpack(ctx, bs, d, filepath.Join(t.TempDir(), "out"))
	if !errors.Is(err, blob.ErrDigestMismatch) {
		t.Fatalf("Unpack over corrupt chunks: %v", err)
	}
	// A missing chunk is reported as not found.
	e, _ := ix.Lookup("etc/passwd")
	must(t, bs.Delete(ctx, e.Chunks[0].Blob()))
	if _, err := ReadChunk(ctx, bs, e.Chunks[0], nil); !errdefs.IsNotFound(err) {
		t.Fatalf("missing chunk: %v", err)
	}
	// A corrupt index is refused too.
	name := filepath.Join(bs.Root(), "sha256", d.Hex()[:2], d.Hex())
	must(t, os.Chmod(name, 0o644))
	must(t, os.WriteFile(name, []byte("garbage"), 0o644))
	if _, err := ReadIndex(ctx, bs, d); !errors.Is(err, blob.ErrDigestMismatch) {
		t.Fatalf("corrupt index: %v", err)
	}
}

// TestIndexValidate rejects malformed indexes that would mislead readers.
func TestIndexValidate(t *testing.T) {
	root := Entry{Path: "", Type: TypeDir}
	d := blob.FromBytes([]byte("x"))
	cases := map[string]Index{
		"no root":          {Version: 1, Entries: []Entry{{Path: "a", Type: TypeDir}}},
		"bad version":      {Version: 9, Entries: []Entry{root}},
		"unsorted":         {Version: 1, Entries: []Entry{root, {Path: "b", Type: TypeDir}, {Path: "a", Type: TypeDir}}},
		"missing parent":   {Version: 1, Entries: []Entry{root, {Path: "a/b", Type: TypeFifo}}},
		"parent not dir":   {Version: 1, Entries: []Entry{root, {Path: "a", Type: TypeSymlink}, {Path: "a/b", Type: TypeFifo}}},
		"escaping path":    {Version: 1, Entries: []Entry{root, {Path: "../x", Type: TypeFifo}}},
		"unclean path":     {Version: 1, Entries: []Entry{root, {Path: "a//b", Type: TypeFifo}}},
		"chunk past EOF":   {Version: 1, Size: 5, Entries: []Entry{root, {Path: "f", Type: TypeReg, Size: 5, Chunks: []Chunk{{Digest: d, Offset: 0, Size: 6}}}}},
		"overlap":          {Version: 1, Size: 9, Entries: []Entry{root, {Path: "f", Type: TypeReg, Size: 9, Chunks: []Chunk{{Digest: d, Size: 5}, {Digest: d, Offset: 4, Size: 5}}}}},
		"hardlink forward": {Version: 1, Entries: []Entry{root, {Path: "a", Type: TypeHardlink, Linkname: "b"}, {Path: "b", Type: TypeFifo}}},
		"hardlink to dir":  {Version: 1, Entries: []Entry{root, {Path: "a", Type: TypeDir}, {Path: "b", Type: TypeHardlink, Linkname: "a"}}},
		"size mismatch":    {Version: 1, Size: 1, Entries: []Entry{root}},
		"unknown type":     {Version: 1, Entries: []Entry{root, {Path: "a", Type: "socket"}}},
	}
	for name, ix := range cases {
		if err := ix.Validate(); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: Validate = %v, want invalid argument", name, err)
		}
	}
	ok := Index{Version: 1, Size: 5, Entries: []Entry{root, {Path: "a", Type: TypeDir}, {Path: "a/f", Type: TypeReg, Size: 5, Chunks: []Chunk{{Digest: d, Size: 5}}}, {Path: "a-b", Type: TypeHardlink, Linkname: "a/f"}}}
	if err := ok.Validate(); err != nil {
		t.Errorf("valid index rejected: %v", err)
	}
}

func TestParseRef(t *testing.T) {
	d := string(blob.FromBytes(nil))
	cases := []struct {
		in, name, tag string
		dgst          blob.Digest
		bad           bool
	}{
		{in: "ubuntu", name: "ubuntu", tag: "latest"},
		{in: "team/py:3.12", name: "team/py", tag: "3.12"},
		{in: "reg.io:5000/a/b:v1", name: "reg.io:5000/a/b", bad: true}, // ports are for Pull sources, not names
		{in: "img@" + d, name: "img", dgst: blob.Digest(d)},
		{in: "Upper:tag", bad: true},
		{in: "a:", bad: true},
		{in: "../x", bad: true},
		{in: "a:b:c", bad: true},
		{in: "img@sha256:zz", bad: true},
	}
	for _, c := range cases {
		n, tg, dg, err := ParseRef(c.in)
		if c.bad {
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("ParseRef(%q) = %v, want invalid argument", c.in, err)
			}
			continue
		}
		if err != nil || n != c.name || tg != c.tag || dg != c.dgst {
			t.Errorf("ParseRef(%q) = %q %q %q %v", c.in, n, tg, dg, err)
		}
	}
}
