package image

import (
	"archive/tar"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// TestBadRootfsTar: every malformed or hostile archive gets an
// invalid-argument error naming the culprit, and the existing version of
// the tag is left as it was.
func TestBadRootfsTar(t *testing.T) {
	ctx := context.Background()
	good := tarBytes(t, []tent{{name: "etc/ok", body: "ok"}})
	cut := func(b []byte, n int) []byte { return b[:n] }
	cases := []struct {
		name    string
		data    []byte
		mention string
	}{
		{"absolute path", tarBytes(t, []tent{{name: "/etc/passwd", body: "x"}}), "/etc/passwd"},
		{"dotdot escape", tarBytes(t, []tent{{name: "a/../../etc/passwd", body: "x"}}), "a/../../etc/passwd"},
		{"dotdot only", tarBytes(t, []tent{{name: "..", typ: tar.TypeDir}}), `".."`},
		{"hardlink outside", tarBytes(t, []tent{{name: "l", typ: tar.TypeLink, link: "../../etc/shadow"}}), "../../etc/shadow"},
		{"hardlink absolute", tarBytes(t, []tent{{name: "l", typ: tar.TypeLink, link: "/etc/shadow"}}), "/etc/shadow"},
		{"hardlink missing", tarBytes(t, []tent{{name: "l", typ: tar.TypeLink, link: "nothere"}}), "nothere"},
		{"hardlink to dir", tarBytes(t, []tent{{name: "d/", typ: tar.TypeDir}, {name: "l", typ: tar.TypeLink, link: "d"}}), `"l"`},
		{"hardlink target replaced by dir", tarBytes(t, []tent{{name: "f", body: "x"}, {name: "l", typ: tar.TypeLink, link: "f"}, {name: "f/", typ: tar.TypeDir}}), `"l"`},
		{"through symlink", tarBytes(t, []tent{{name: "etc", typ: tar.TypeSymlink, link: "/etc"}, {name: "etc/passwd", body: "x"}}), "etc/passwd"},
		{"truncated in content", cut(tarBytes(t, []tent{{name: "big", body: strings.Repeat("x", 5000)}}), 2048), "big"},
		{"truncated in header", cut(good, 300), "truncated"},
		{"truncated at boundary", cut(tarBytes(t, []tent{{name: "a", body: "1"}, {name: "b", body: "2"}}), 1024), "truncated"},
		{"not a tar", []byte(strings.Repeat("this is not a tar archive ", 40)), "tar"},
		{"truncated gzip", cut(gzipBytes(t, tarBytes(t, []tent{{name: "big", body: string(randBytes(3, 100000))}})), 5000), "big"},
	}
	s, bs := newTestStore(t)
	p := filepath.Join(t.TempDir(), "good.tar")
	must(t, os.WriteFile(p, good, 0o644))
	before, err := s.Import(ctx, "victim:1", p)
	must(t, err)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "bad.tar")
			must(t, os.WriteFile(p, c.data, 0o644))
			_, err := s.Import(ctx, "victim:1", p)
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("Import = %v, want invalid argument", err)
			}
			if !strings.Contains(err.Error(), c.mention) {
				t.Fatalf("error %q does not mention %q", err, c.mention)
			}
			after, err := s.Resolve(ctx, "victim:1")
			if err != nil || after.Digest != before.Digest {
				t.Fatalf("failed import changed the existing tag: %v", err)
			}
			if _, err := s.Import(ctx, "fresh:1", p); err == nil {
				t.Fatal("second attempt succeeded")
			}
			if _, err := s.Resolve(ctx, "fresh:1"); !errdefs.IsNotFound(err) {
				t.Fatalf("failed import created a tag: %v", err)
			}
		})
	}
	// The original image is still whole.
	if _, err := ReadIndex(ctx, bs, before.Manifest.Layers[0].Digest); err != nil {
		t.Fatal(err)
	}
}

// TestBadOCIInput: wrong digests anywhere in an OCI layout or a docker
// archive are detected; nothing is tagged.
func TestBadOCIInput(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	img := testImage(t)

	t.Run("corrupt layer blob", func(t *testing.T) {
		dir := writeLayout(t, img)
		layers, err := img.Layers()
		must(t, err)
		d, err := layers[1].Digest()
		must(t, err)
		flipByte(t, filepath.Join(dir, "blobs", "sha256", d.Hex), 40)
		_, err = s.Import(ctx, "bad:layer", dir)
		if !errors.Is(err, blob.ErrDigestMismatch) || !strings.Contains(err.Error(), "layer 2/2") {
			t.Fatalf("Import = %v, want digest mismatch on layer 2/2", err)
		}
	})
	t.Run("corrupt config", func(t *testing.T) {
		dir := writeLayout(t, img)
		cn, err := img.ConfigName()
		must(t, err)
		p := filepath.Join(dir, "blobs", "sha256", cn.Hex)
		b, err := os.ReadFile(p)
		must(t, err)
		must(t, os.WriteFile(p, []byte(strings.Replace(string(b), "LANG=C.UTF-8", "LANG=C.UTF-9", 1)), 0o644))
		if _, err := s.Import(ctx, "bad:config", dir); !errors.Is(err, blob.ErrDigestMismatch) {
			t.Fatalf("Import = %v, want digest mismatch", err)
		}
	})
	t.Run("wrong diff_id", func(t *testing.T) {
		// A docker archive whose layer does not match the config.
		cf, err := img.ConfigFile()
		must(t, err)
		cf = cf.DeepCopy()
		cf.RootFS.DiffIDs[0] = cf.RootFS.DiffIDs[1]
		bad, err := mutate.ConfigFile(img, cf)
		must(t, err)
		_, err = s.Import(ctx, "bad:diffid", writeDockerArchive(t, bad))
		if !errdefs.IsInvalidArgument(err) {
			t.Fatalf("Import = %v, want invalid argument", err)
		}
	})
	t.Run("hostile layer", func(t *testing.T) {
		evil, err := mutate.AppendLayers(empty.Image, tarLayer(t, []tent{{name: "../../root/.ssh/authorized_keys", body: "key"}}))
		must(t, err)
		_, err = s.Import(ctx, "bad:evil", writeLayout(t, evil))
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "authorized_keys") {
			t.Fatalf("Import = %v", err)
		}
	})
	t.Run("bad whiteout", func(t *testing.T) {
		evil, err := mutate.AppendLayers(empty.Image, tarLayer(t, []tent{{name: "a/.wh..", body: ""}}))
		must(t, err)
		if _, err := s.Import(ctx, "bad:wh", writeLayout(t, evil)); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("Import = %v", err)
		}
	})
	list, err := s.List(ctx)
	must(t, err)
	if len(list) != 0 {
		t.Fatalf("failed imports left tags: %+v", list)
	}
	if _, err := s.Import(ctx, "x", filepath.Join(t.TempDir(), "absent")); !errdefs.IsNotFound(err) {
		t.Fatalf("missing path: %v", err)
	}
	if _, err := s.Import(ctx, "Bad Ref", t.TempDir()); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad ref: %v", err)
	}
}

func flipByte(t *testing.T, p string, off int) {
	t.Helper()
	b, err := os.ReadFile(p)
	must(t, err)
	b[off] ^= 0x55
	must(t, os.Chmod(p, 0o644))
	must(t, os.WriteFile(p, b, 0o644))
}
