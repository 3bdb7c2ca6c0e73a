package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testutil"
)

// tent is one tar entry for test archives.
type tent struct {
	name     string
	typ      byte
	body     string
	link     string
	mode     int64
	uid, gid int
	pax      map[string]string
}

var mtime = time.Date(2023, 5, 6, 7, 8, 9, 0, time.UTC)

func tarBytes(t testing.TB, ents []tent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: mtime, PAXRecords: e.pax, Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		must(t, tw.WriteHeader(h))
		if e.body != "" {
			_, err := tw.Write([]byte(e.body))
			must(t, err)
		}
	}
	must(t, tw.Close())
	return buf.Bytes()
}

func tarLayer(t testing.TB, ents []tent) v1.Layer {
	t.Helper()
	b := tarBytes(t, ents)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	must(t, err)
	return l
}

var baseLayer = []tent{
	{name: "etc/", typ: tar.TypeDir, mode: 0o755},
	{name: "etc/hostname", body: "box\n"},
	{name: "etc/passwd", body: "root:x:0:0::/root:/bin/sh\n", pax: map[string]string{"SCHILY.xattr.user.k": "v"}},
	{name: "bin/", typ: tar.TypeDir, mode: 0o755},
	{name: "bin/ping", body: "ELF", mode: 0o4755, pax: map[string]string{"SCHILY.xattr.security.capability": "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"}},
	{name: "bin/ping6", typ: tar.TypeLink, link: "bin/ping"},
	{name: "bin/sh", typ: tar.TypeSymlink, link: "/bin/busybox"},
	{name: "usr/", typ: tar.TypeDir, mode: 0o755},
	{name: "usr/old", body: "old"},
	{name: "home/u/", typ: tar.TypeDir, mode: 0o700, uid: 1000, gid: 1000},
	{name: "opq/", typ: tar.TypeDir, pax: map[string]string{"SCHILY.xattr.trusted.overlay.opaque": "y"}},
}

var topLayer = []tent{
	{name: "etc/.wh.hostname", body: ""},
	{name: "usr/.wh..wh..opq", body: ""},
	{name: "usr/new", body: "new"},
	{name: "etc/.wh..wh.plnk/", typ: tar.TypeDir},
	{name: "gone/.wh.x", body: ""},
}

func testImage(t testing.TB) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, tarLayer(t, baseLayer), tarLayer(t, topLayer))
	must(t, err)
	cf, err := img.ConfigFile()
	must(t, err)
	cf = cf.DeepCopy()
	cf.Created = v1.Time{Time: mtime}
	cf.Config.Env = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}
	cf.Config.Cmd = []string{"/bin/sh"}
	cf.Config.WorkingDir = "/home/u"
	img, err = mutate.ConfigFile(img, cf)
	must(t, err)
	return img
}

func writeLayout(t testing.TB, img v1.Image) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	must(t, err)
	must(t, p.AppendImage(img))
	return dir
}

func writeDockerArchive(t testing.TB, img v1.Image) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "image.tar")
	must(t, tarball.WriteToFile(p, name.MustParseReference("test/img:1"), img))
	return p
}

func checkOCISemantics(t *testing.T, s *Store, im *Image) {
	t.Helper()
	ctx := context.Background()
	if len(im.Manifest.Layers) != 2 {
		t.Fatalf("%d layers, want 2", len(im.Manifest.Layers))
	}
	if got := strings.Join(im.Manifest.Config.Env, ","); got != "PATH=/usr/bin:/bin,LANG=C.UTF-8" || im.Manifest.Config.WorkingDir != "/home/u" {
		t.Fatalf("config not kept: %+v", im.Manifest.Config)
	}
	base, err := ReadIndex(ctx, s.Blobs(), im.Manifest.Layers[0].Digest)
	must(t, err)
	if e, _ := base.Lookup("bin/ping6"); e == nil || e.Type != TypeHardlink || e.Linkname != "bin/ping" {
		t.Fatalf("hardlink: %+v", e)
	}
	if e, _ := base.Lookup("bin/ping"); e.Mode&os.ModeSetuid == 0 || len(e.Xattrs["security.capability"]) != 20 {
		t.Fatalf("setuid/capability lost: %+v", e)
	}
	if e, _ := base.Lookup("bin/sh"); e.Type != TypeSymlink || e.Linkname != "/bin/busybox" {
		t.Fatalf("symlink: %+v", e)
	}
	if e, _ := base.Lookup("home/u"); e.UID != 1000 || e.Mode.Perm() != 0o700 {
		t.Fatalf("owner/mode: %+v", e)
	}
	if e, _ := base.Lookup("opq"); e.IsOpaque() {
		t.Fatalf("a tar xattr made a directory opaque")
	}
	top, err := ReadIndex(ctx, s.Blobs(), im.Manifest.Layers[1].Digest)
	must(t, err)
	if e, ok := top.Lookup("etc/hostname"); !ok || !e.IsWhiteout() {
		t.Fatalf("whiteout not translated: %+v", e)
	}
	if e, ok := top.Lookup("usr"); !ok || !e.IsOpaque() {
		t.Fatalf("opaque dir not translated: %+v", e)
	}
	if e, ok := top.Lookup("gone/x"); !ok || !e.IsWhiteout() {
		t.Fatalf("whiteout in implicit dir: %+v", e)
	}
	for _, e := range top.Entries {
		if strings.Contains(e.Path, ".wh.") {
			t.Fatalf("whiteout name %q left in the index", e.Path)
		}
	}
}

func TestImportOCILayout(t *testing.T) {
	ctx := context.Background()
	s, bs := newTestStore(t)
	dir := writeLayout(t, testImage(t))
	var progress []Progress
	im, err := s.Import(ctx, "test/img:1", dir, WithProgress(func(p Progress) { progress = append(progress, p) }), WithOwner("team", true))
	must(t, err)
	checkOCISemantics(t, s, im)
	if len(progress) < 3 || progress[0].Layers != 2 || !progress[len(progress)-1].Done || progress[len(progress)-1].Layer != 2 {
		t.Fatalf("progress reports: %+v", progress)
	}
	got, err := s.Resolve(ctx, "test/img:1")
	must(t, err)
	if got.Digest != im.Digest || got.Owner != "team" || !got.Public {
		t.Fatalf("Resolve = %+v", got)
	}
	if byDigest, err := s.Resolve(ctx, "test/img@"+string(im.Digest)); err != nil || byDigest.Digest != im.Digest {
		t.Fatalf("Resolve by digest: %v", err)
	}

	// Importing again stores nothing new.
	n := countBlobs(t, bs)
	im2, err := s.Import(ctx, "test/img:1", dir)
	must(t, err)
	if im2.Digest != im.Digest || countBlobs(t, bs) != n {
		t.Fatalf("re-import: digest %s vs %s, blobs %d vs %d", im2.Digest, im.Digest, countBlobs(t, bs), n)
	}

	if os.Geteuid() == 0 {
		out := filepath.Join(t.TempDir(), "top")
		must(t, Unpack(ctx, bs, im.Manifest.Layers[1].Digest, out))
		var st unix.Stat_t
		must(t, unix.Lstat(filepath.Join(out, "etc/hostname"), &st))
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
			t.Fatalf("unpacked whiteout mode %o rdev %d", st.Mode, st.Rdev)
		}
		if v, err := lgetxattr(filepath.Join(out, "usr"), XattrOpaque); err != nil || string(v) != "y" {
			t.Fatalf("unpacked opaque xattr: %q %v", v, err)
		}
	}
}

func TestImportDockerArchive(t *testing.T) {
	ctx := context.Background()
	s, bs := newTestStore(t)
	img := testImage(t)
	im, err := s.Import(ctx, "docker:1", writeDockerArchive(t, img))
	must(t, err)
	checkOCISemantics(t, s, im)

	// The same image from an OCI layout shares every layer.
	n := countBlobs(t, bs)
	im2, err := s.Import(ctx, "oci:1", writeLayout(t, img))
	must(t, err)
	for i := range im.Manifest.Layers {
		if im.Manifest.Layers[i].Digest != im2.Manifest.Layers[i].Digest {
			t.Fatalf("layer %d differs between docker-archive and OCI layout imports", i)
		}
	}
	if added := countBlobs(t, bs) - n; added != 1 { // the new manifest only
		t.Fatalf("second format import added %d blobs, want 1 (manifest)", added)
	}

	// docker save | gzip is accepted too.
	raw, err := os.ReadFile(writeDockerArchive(t, img))
	must(t, err)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, err = zw.Write(raw)
	must(t, err)
	must(t, zw.Close())
	im3, err := s.ImportReader(ctx, "docker:gz", &gz)
	must(t, err)
	if im3.Manifest.Layers[1].Digest != im.Manifest.Layers[1].Digest {
		t.Fatalf("gzip docker archive imported differently")
	}
}

// TestImportOCIArchive imports an OCI layout packed in a tar.
func TestImportOCIArchive(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	dir := writeLayout(t, testImage(t))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	must(t, tw.AddFS(os.DirFS(dir)))
	must(t, tw.Close())
	im, err := s.ImportReader(ctx, "ociarchive", &buf)
	must(t, err)
	checkOCISemantics(t, s, im)
	if im.Ref != "ociarchive:latest" {
		t.Fatalf("ref %q", im.Ref)
	}
}

func TestImportRootfsTar(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	raw := tarBytes(t, []tent{
		{name: "./", typ: tar.TypeDir, mode: 0o755},
		{name: "./etc/os-release", body: "ID=test\n"},
		{name: "./.wh.not-a-whiteout", body: "plain file in a rootfs"},
		{name: "./dev/null", typ: tar.TypeChar, mode: 0o666},
	})
	for name, data := range map[string][]byte{"plain": raw, "gzip": gzipBytes(t, raw), "zstd": zenc.EncodeAll(raw, nil)} {
		p := filepath.Join(t.TempDir(), "rootfs.tar")
		must(t, os.WriteFile(p, data, 0o644))
		im, err := s.Import(ctx, "rootfs:"+name, p)
		must(t, err)
		ix, err := ReadIndex(ctx, s.Blobs(), im.Manifest.Layers[0].Digest)
		must(t, err)
		if _, ok := ix.Lookup(".wh.not-a-whiteout"); !ok {
			t.Fatalf("%s: .wh. name in a rootfs tar was treated as a whiteout", name)
		}
		if _, ok := ix.Lookup("dev/null"); ok {
			t.Fatalf("%s: device kept against the default policy", name)
		}
		if e, _ := ix.Lookup("etc/os-release"); e == nil || e.Size != 8 {
			t.Fatalf("%s: file missing", name)
		}
	}
}

func gzipBytes(t testing.TB, b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, err := zw.Write(b)
	must(t, err)
	must(t, zw.Close())
	return buf.Bytes()
}

// TestPull pulls from an in-process registry on loopback.
func TestPull(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	img := testImage(t)
	ref, err := name.ParseReference(host+"/team/img:v1", name.Insecure)
	must(t, err)
	must(t, remote.Write(ref, img, remote.WithContext(ctx)))

	s, _ := newTestStore(t)
	im, err := s.Pull(ctx, host+"/team/img:v1", "pulled:v1", WithInsecureRegistry())
	must(t, err)
	checkOCISemantics(t, s, im)

	if _, err := s.Pull(ctx, host+"/team/absent:v1", "x", WithInsecureRegistry()); !errdefs.IsNotFound(err) {
		t.Fatalf("pull of a missing image: %v, want not found", err)
	}
	if _, err := s.Resolve(ctx, "x"); !errdefs.IsNotFound(err) {
		t.Fatalf("failed pull left a tag: %v", err)
	}
}

// TestDedupAndVersions: images sharing a layer share its chunks, and
// replacing one layer leaves the others as they are.
func TestDedupAndVersions(t *testing.T) {
	ctx := context.Background()
	s, bs := newTestStore(t)
	shared := tarLayer(t, []tent{{name: "big", body: string(randBytes(9, 3<<20))}})
	mk := func(extra string) v1.Image {
		img, err := mutate.AppendLayers(empty.Image, shared, tarLayer(t, []tent{{name: "f", body: extra}}), tarLayer(t, []tent{{name: "g", body: "top"}}))
		must(t, err)
		return img
	}
	a, err := s.Import(ctx, "a:1", writeLayout(t, mk("a")))
	must(t, err)
	n := countBlobs(t, bs)
	b, err := s.Import(ctx, "b:1", writeLayout(t, mk("b")))
	must(t, err)
	if a.Manifest.Layers[0].Digest != b.Manifest.Layers[0].Digest {
		t.Fatalf("shared layer imported twice differently")
	}
	// b adds: its middle layer index + chunk "b", manifest. The top layer
	// and the 3 MiB base are shared.
	if added := countBlobs(t, bs) - n; added != 3 {
		t.Fatalf("second image added %d blobs, want 3", added)
	}

	// Version a:2 = a:1 with the middle layer replaced.
	mid, _, err := s.BuildLayer(ctx, t.TempDir())
	must(t, err)
	a2, err := s.WithLayers(ctx, "a:1", "a:2", map[int]blob.Digest{1: mid})
	must(t, err)
	if a2.Manifest.Layers[0] != a.Manifest.Layers[0] || a2.Manifest.Layers[2] != a.Manifest.Layers[2] || a2.Manifest.Layers[1].Digest != mid {
		t.Fatalf("versioning changed other layers: %+v", a2.Manifest.Layers)
	}
	if a2.Manifest.Parent != a.Digest {
		t.Fatalf("parent = %s, want %s", a2.Manifest.Parent, a.Digest)
	}
	if old, err := s.Resolve(ctx, "a:1"); err != nil || old.Digest != a.Digest {
		t.Fatalf("old version lost: %v", err)
	}
	st, err := s.Stats(ctx, "a:2")
	must(t, err)
	if len(st.Layers) != 3 || st.Size != 3<<20+3 || st.StoredBytes <= 3<<20 {
		t.Fatalf("stats = %+v", st)
	}
	list, err := s.List(ctx)
	must(t, err)
	if len(list) != 3 || list[0].Ref != "a:1" || list[1].Ref != "a:2" || list[2].Ref != "b:1" {
		t.Fatalf("List = %+v", list)
	}
}

// TestImportRandomImage imports a go-containerregistry random image
// (incompressible layers) and unpacks it.
func TestImportRandomImage(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx := context.Background()
	s, bs := newTestStore(t)
	img, err := random.Image(2<<20, 3)
	must(t, err)
	im, err := s.Import(ctx, "random", writeLayout(t, img))
	must(t, err)
	for _, l := range im.Manifest.Layers {
		must(t, Unpack(ctx, bs, l.Digest, filepath.Join(t.TempDir(), "l")))
	}
}

// TestImportSparseTar: zero runs in an archive (how tar carries holes,
// GNU sparse entries included once read) are stored as no chunk and
// unpacked as holes.
func TestImportSparseTar(t *testing.T) {
	ctx := context.Background()
	s, bs := newTestStore(t)
	body := make([]byte, 12<<20)
	copy(body[6<<20:], "data in the middle")
	p := filepath.Join(t.TempDir(), "sparse.tar")
	must(t, os.WriteFile(p, tarBytes(t, []tent{{name: "disk.img", body: string(body)}}), 0o644))
	im, err := s.Import(ctx, "sparse", p)
	must(t, err)
	ix, err := ReadIndex(ctx, bs, im.Manifest.Layers[0].Digest)
	must(t, err)
	e, _ := ix.Lookup("disk.img")
	if e.Size != 12<<20 || len(e.Chunks) != 1 || e.Chunks[0].Offset != 6<<20 {
		t.Fatalf("sparse entry: size %d chunks %+v", e.Size, e.Chunks)
	}
	if os.Geteuid() != 0 {
		return
	}
	out := filepath.Join(t.TempDir(), "out")
	must(t, Unpack(ctx, bs, im.Manifest.Layers[0].Digest, out))
	got, err := os.ReadFile(filepath.Join(out, "disk.img"))
	must(t, err)
	if !bytes.Equal(got, body) {
		t.Fatalf("sparse file content differs")
	}
	if b := blocks(t, filepath.Join(out, "disk.img")); b > 2*(DefaultChunkSize/512) {
		t.Fatalf("unpacked sparse file uses %d blocks", b)
	}
}
