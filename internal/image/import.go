package image

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

type importConfig struct {
	progress func(Progress)
	owner    string
	public   bool
	insecure bool
}

// ImportOpt configures Import, ImportReader, Pull and CommitDir.
type ImportOpt func(*importConfig)

// WithProgress receives progress reports (throttled, plus one per layer
// and a final Done).
func WithProgress(fn func(Progress)) ImportOpt { return func(c *importConfig) { c.progress = fn } }

// WithOwner records the owning tenant and visibility of the new tag.
func WithOwner(owner string, public bool) ImportOpt {
	return func(c *importConfig) { c.owner, c.public = owner, public }
}

// WithInsecureRegistry lets Pull use plain HTTP (a registry on loopback).
func WithInsecureRegistry() ImportOpt { return func(c *importConfig) { c.insecure = true } }

// Import imports the image at path (on this host) as ref. path may be an
// OCI image layout directory, an OCI or docker-archive tarball (docker
// save; plain or gzip/zstd compressed), a rootfs directory or a rootfs tar
// (plain, gzip or zstd). Nothing is tagged unless the whole import
// succeeds; chunks written by a failed import are left for GC.
func (s *Store) Import(ctx context.Context, ref, path string, opts ...ImportOpt) (*Image, error) {
	ref, err := NormalizeRef(ref)
	if err != nil {
		return nil, err
	}
	var cfg importConfig
	for _, o := range opts {
		o(&cfg)
	}
	s.gcMu.RLock()
	defer s.gcMu.RUnlock()

	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("import %s: %w", path, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", path, err)
	}
	if fi.IsDir() {
		if _, err := os.Stat(filepath.Join(path, "oci-layout")); err == nil {
			return s.importLayout(ctx, ref, path, "oci-layout "+path, cfg)
		}
		return s.importRootfs(ctx, ref, "rootfs dir "+path, cfg, func(b *builder) error { return b.addDir(path, false) })
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("import %s: not a directory or regular file: %w", path, errdefs.ErrInvalidArgument)
	}
	kind, err := sniffArchive(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", path, err)
	}
	switch kind {
	case archiveDocker:
		return s.importDockerArchive(ctx, ref, path, cfg)
	case archiveOCI:
		dir, err := os.MkdirTemp(s.cfg.tmpDir, "dsec-oci-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		if err := extractOCIArchive(ctx, path, dir); err != nil {
			return nil, fmt.Errorf("import %s: %w", path, err)
		}
		return s.importLayout(ctx, ref, dir, "oci-archive "+path, cfg)
	}
	what := "rootfs tar " + path
	return s.importRootfs(ctx, ref, what, cfg, func(b *builder) error {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		r, closeR, err := decompress(f)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		defer closeR()
		ec := &endCheck{r: r}
		if err := b.addTar(ec, false, what); err != nil {
			return err
		}
		if !ec.sawEnd() {
			return fmt.Errorf("%s: truncated tar (no end-of-archive marker): %w", what, errdefs.ErrInvalidArgument)
		}
		return nil
	})
}

// ImportReader imports an uploaded image (any tar form Import accepts) by
// spooling it to a temporary file first: archive formats need random
// access, and a broken upload must not leave a half-imported image.
func (s *Store) ImportReader(ctx context.Context, ref string, r io.Reader, opts ...ImportOpt) (*Image, error) {
	if _, err := NormalizeRef(ref); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(s.cfg.tmpDir, "dsec-upload-*")
	if err != nil {
		return nil, err
	}
	defer func() { f.Close(); os.Remove(f.Name()) }()
	if _, err := io.Copy(f, ctxReader{ctx, r}); err != nil {
		return nil, fmt.Errorf("import upload: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	return s.Import(ctx, ref, f.Name(), opts...)
}

func (s *Store) importRootfs(ctx context.Context, ref, what string, cfg importConfig, fill func(*builder) error) (*Image, error) {
	pt := newProgress(cfg.progress, 1)
	pt.layer(1)
	b := newBuilder(ctx, s.blobs, s.buildConfig(pt.add))
	defer b.close()
	if err := fill(b); err != nil {
		return nil, err
	}
	ix, err := b.finish()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	d, err := putIndex(ctx, s.blobs, ix)
	if err != nil {
		return nil, err
	}
	m := &Manifest{Layers: []LayerRef{{Digest: d, Size: ix.Size}}, Source: what}
	im, err := s.writeImage(ctx, ref, m, tagOpts{owner: cfg.owner, public: cfg.public})
	if err == nil {
		pt.done()
	}
	return im, err
}

func (s *Store) importDockerArchive(ctx context.Context, ref, path string, cfg importConfig) (*Image, error) {
	// ggcr reads docker archives from a plain tar; decompress a
	// `docker save | gzip` once to a temp file.
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	head := make([]byte, 4)
	n, _ := io.ReadFull(f, head)
	f.Close()
	if sniffCompression(head[:n]) != compNone {
		tmp, err := s.decompressToTemp(ctx, path)
		if err != nil {
			return nil, err
		}
		defer os.Remove(tmp)
		path = tmp
	}
	img, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		return nil, fmt.Errorf("docker archive %s: %w: %w", path, errdefs.ErrInvalidArgument, err)
	}
	return s.importV1(ctx, ref, img, "docker-archive "+path, false, cfg)
}

func (s *Store) decompressToTemp(ctx context.Context, path string) (string, error) {
	in, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer in.Close()
	r, closeR, err := decompress(in)
	if err != nil {
		return "", err
	}
	defer closeR()
	out, err := os.CreateTemp(s.cfg.tmpDir, "dsec-archive-*")
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(out, ctxReader{ctx, r}); err != nil {
		out.Close()
		os.Remove(out.Name())
		return "", fmt.Errorf("decompress %s: %w: %w", path, errdefs.ErrInvalidArgument, err)
	}
	return out.Name(), out.Close()
}

// importLayout imports the one image of an OCI layout (or, in a
// multi-platform index, the one for this host's platform).
func (s *Store) importLayout(ctx context.Context, ref, dir, what string, cfg importConfig) (*Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %w", what, errdefs.ErrInvalidArgument, err)
	}
	img, err := pickImage(idx, what, 0)
	if err != nil {
		return nil, err
	}
	return s.importV1(ctx, ref, img, what, true, cfg)
}

func pickImage(idx v1.ImageIndex, what string, depth int) (v1.Image, error) {
	if depth > 4 {
		return nil, fmt.Errorf("%s: image indexes nested too deep: %w", what, errdefs.ErrInvalidArgument)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %w", what, errdefs.ErrInvalidArgument, err)
	}
	var cands []v1.Descriptor
	for _, d := range im.Manifests {
		if d.MediaType.IsImage() || d.MediaType.IsIndex() {
			cands = append(cands, d)
		}
	}
	if len(cands) > 1 {
		var plat []v1.Descriptor
		for _, d := range cands {
			if d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == runtime.GOARCH {
				plat = append(plat, d)
			}
		}
		cands = plat
	}
	if len(cands) != 1 {
		return nil, fmt.Errorf("%s: expected one image (or one for linux/%s), found %d: %w", what, runtime.GOARCH, len(cands), errdefs.ErrInvalidArgument)
	}
	d := cands[0]
	if d.MediaType.IsIndex() {
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, fmt.Errorf("%s: %w: %w", what, errdefs.ErrInvalidArgument, err)
		}
		return pickImage(child, what, depth+1)
	}
	img, err := idx.Image(d.Digest)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %w", what, errdefs.ErrInvalidArgument, err)
	}
	raw, err := img.RawManifest()
	if err != nil {
		return nil, fmt.Errorf("%s: manifest: %w: %w", what, errdefs.ErrInvalidArgument, err)
	}
	if got := blob.FromBytes(raw); string(got) != d.Digest.String() {
		return nil, fmt.Errorf("%s: manifest %s hashes to %s: %w", what, d.Digest, got, blob.ErrDigestMismatch)
	}
	return img, nil
}

// importV1 turns a go-containerregistry image into dsec layers. With
// compressedKnown (OCI layouts, registries) each layer blob is checked
// against its manifest digest and, uncompressed, against the config's
// diff_id; docker archives only have the diff_ids.
func (s *Store) importV1(ctx context.Context, ref string, img v1.Image, what string, compressedKnown bool, cfg importConfig) (*Image, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("%s: config: %w: %w", what, errdefs.ErrInvalidArgument, err)
	}
	if compressedKnown {
		raw, err := img.RawConfigFile()
		if err != nil {
			return nil, fmt.Errorf("%s: config: %w: %w", what, errdefs.ErrInvalidArgument, err)
		}
		mf, err := img.Manifest()
		if err != nil {
			return nil, fmt.Errorf("%s: manifest: %w: %w", what, errdefs.ErrInvalidArgument, err)
		}
		if got := blob.FromBytes(raw); string(got) != mf.Config.Digest.String() {
			return nil, fmt.Errorf("%s: config %s hashes to %s: %w", what, mf.Config.Digest, got, blob.ErrDigestMismatch)
		}
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("%s: layers: %w: %w", what, errdefs.ErrInvalidArgument, err)
	}
	if len(layers) != len(cf.RootFS.DiffIDs) {
		return nil, fmt.Errorf("%s: %d layers but %d diff_ids in the config: %w", what, len(layers), len(cf.RootFS.DiffIDs), errdefs.ErrInvalidArgument)
	}
	pt := newProgress(cfg.progress, len(layers))
	// The image's own creation time keeps re-imports byte-identical, so
	// importing the same image twice stores nothing new.
	m := &Manifest{Source: what, Created: cf.Created.UTC(), Config: Config{
		Env:        cf.Config.Env,
		Entrypoint: cf.Config.Entrypoint,
		Cmd:        cf.Config.Cmd,
		WorkingDir: cf.Config.WorkingDir,
		User:       cf.Config.User,
		Labels:     cf.Config.Labels,
	}}
	for i, l := range layers {
		pt.layer(i + 1)
		lw := fmt.Sprintf("%s: layer %d/%d (diff_id %s)", what, i+1, len(layers), cf.RootFS.DiffIDs[i])
		lr, err := s.importV1Layer(ctx, l, cf.RootFS.DiffIDs[i], compressedKnown, lw, pt)
		if err != nil {
			return nil, err
		}
		m.Layers = append(m.Layers, lr)
	}
	im, err := s.writeImage(ctx, ref, m, tagOpts{owner: cfg.owner, public: cfg.public})
	if err == nil {
		pt.done()
	}
	return im, err
}

func (s *Store) importV1Layer(ctx context.Context, l v1.Layer, diffID v1.Hash, compressedKnown bool, what string, pt *progressTracker) (LayerRef, error) {
	var (
		rc      io.ReadCloser
		err     error
		zh      hash.Hash
		wantZ   v1.Hash
		src     io.Reader
		closeFn = func() {}
	)
	if compressedKnown {
		if wantZ, err = l.Digest(); err != nil {
			return LayerRef{}, fmt.Errorf("%s: %w: %w", what, errdefs.ErrInvalidArgument, err)
		}
		if rc, err = l.Compressed(); err != nil {
			return LayerRef{}, fmt.Errorf("%s: %w: %w", what, errdefs.ErrInvalidArgument, err)
		}
		zh = sha256.New()
		src, closeFn, err = decompress(io.TeeReader(rc, zh))
		if err != nil {
			rc.Close()
			return LayerRef{}, fmt.Errorf("%s: %w", what, err)
		}
	} else {
		if rc, err = l.Uncompressed(); err != nil {
			return LayerRef{}, fmt.Errorf("%s: %w: %w", what, errdefs.ErrInvalidArgument, err)
		}
		src = rc
	}
	defer rc.Close()
	defer closeFn()
	uh := sha256.New()
	ur := io.TeeReader(ctxReader{ctx, src}, uh)

	b := newBuilder(ctx, s.blobs, s.buildConfig(pt.add))
	defer b.close()
	tarErr := b.addTar(ur, true, what)
	// Read what the tar reader left (end padding) so the digests cover
	// the whole blob; a digest mismatch explains a tar error better
	// than the tar error itself.
	_, drainErr := io.Copy(io.Discard, ur)
	if compressedKnown {
		io.Copy(io.Discard, rc)
		if got := blob.FromHash(zh.Sum(nil)); string(got) != wantZ.String() {
			return LayerRef{}, fmt.Errorf("%s: layer blob %s hashes to %s: %w", what, wantZ, got, blob.ErrDigestMismatch)
		}
	}
	if tarErr == nil && drainErr == nil {
		if got := blob.FromHash(uh.Sum(nil)); string(got) != diffID.String() {
			return LayerRef{}, fmt.Errorf("%s: uncompressed layer hashes to %s: %w", what, got, blob.ErrDigestMismatch)
		}
	}
	if tarErr != nil {
		return LayerRef{}, tarErr
	}
	if drainErr != nil {
		return LayerRef{}, fmt.Errorf("%s: %w: %w", what, truncErr(drainErr), drainErr)
	}
	ix, err := b.finish()
	if err != nil {
		return LayerRef{}, fmt.Errorf("%s: %w", what, err)
	}
	d, err := putIndex(ctx, s.blobs, ix)
	if err != nil {
		return LayerRef{}, err
	}
	return LayerRef{Digest: d, Size: ix.Size, DiffID: diffID.String()}, nil
}

// Archive kinds.
const (
	archiveRootfs = iota
	archiveDocker
	archiveOCI
)

// sniffArchive tells a docker-archive (manifest.json naming layers) or an
// OCI archive (oci-layout + index.json) from a rootfs tar by listing the
// top-level names.
func sniffArchive(ctx context.Context, path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	head := make([]byte, 4)
	n, _ := io.ReadFull(f, head)
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return 0, err
	}
	var r io.Reader = f // plain: tar skips file bodies by seeking
	if sniffCompression(head[:n]) != compNone {
		dr, closeR, err := decompress(f)
		if err != nil {
			return 0, err
		}
		defer closeR()
		r = dr
	}
	tr := tar.NewReader(ctxReader{ctx, r})
	var manifest []byte
	var ociLayout, ociIndex bool
	last := "(none)"
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("after entry %q: %w: %w", last, truncErr(err), err)
		}
		last = hdr.Name
		switch filepath.Clean(hdr.Name) {
		case "manifest.json":
			if hdr.Size < 1<<20 {
				manifest, _ = io.ReadAll(tr)
			}
		case "oci-layout":
			ociLayout = true
		case "index.json":
			ociIndex = true
		}
	}
	if manifest != nil {
		var m []struct {
			Config string
			Layers []string
		}
		if json.Unmarshal(manifest, &m) == nil && len(m) > 0 && m[0].Config != "" {
			return archiveDocker, nil
		}
	}
	if ociLayout && ociIndex {
		return archiveOCI, nil
	}
	return archiveRootfs, nil
}

// extractOCIArchive unpacks an OCI archive's regular files and
// directories into dir, refusing names that escape it.
func extractOCIArchive(ctx context.Context, path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r, closeR, err := decompress(f)
	if err != nil {
		return err
	}
	defer closeR()
	tr := tar.NewReader(ctxReader{ctx, r})
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: %w", truncErr(err), err)
		}
		p, err := cleanEntryPath(hdr.Name, "oci archive")
		if err != nil {
			return err
		}
		if p == "" {
			continue
		}
		full := filepath.Join(dir, filepath.FromSlash(p))
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(full, 0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(full), 0o700); err != nil {
				return err
			}
			out, err := os.OpenFile(full, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("oci archive: %q: %w: %w", hdr.Name, truncErr(err), err)
			}
		}
	}
}

// endCheck remembers whether the last 512-byte block a tar reader
// consumed was zeros, i.e. the archive ended with its end marker rather
// than being cut at an entry boundary.
type endCheck struct {
	r     io.Reader
	last  [512]byte
	total int64
}

func (e *endCheck) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if n > 0 {
		if n >= 512 {
			copy(e.last[:], p[n-512:n])
		} else {
			copy(e.last[:], e.last[n:])
			copy(e.last[512-n:], p[:n])
		}
		e.total += int64(n)
	}
	return n, err
}

func (e *endCheck) sawEnd() bool { return e.total >= 1024 && isZero(e.last[:]) }

// ctxReader stops a long read when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
