package image

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/blob"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// ManifestMediaType marks dsec image manifests.
const ManifestMediaType = "application/vnd.dsec.image.v1+json"

// Manifest is one image version: an immutable blob naming its layers
// bottom-first. Changing one layer makes a new manifest that shares every
// other layer (and their chunks) with the old one.
type Manifest struct {
	MediaType string      `json:"mediaType"`
	Layers    []LayerRef  `json:"layers"` // bottom first
	Created   time.Time   `json:"created"`
	Parent    blob.Digest `json:"parent,omitempty"` // manifest this version was derived from
	Size      int64       `json:"size"`             // sum of layer sizes
	Config    Config      `json:"config"`
	Source    string      `json:"source,omitempty"` // where it came from, for humans
}

// LayerRef is a layer of an image.
type LayerRef struct {
	Digest blob.Digest `json:"digest"` // the layer index blob
	Size   int64       `json:"size"`   // uncompressed file bytes
	// DiffID is the OCI uncompressed-tar digest the layer was imported
	// from, if any (provenance; dsec never needs the tar again).
	DiffID string `json:"diff_id,omitempty"`
}

// Config is the part of an OCI image config a sandbox runtime uses.
type Config struct {
	Env        []string          `json:"env,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Cmd        []string          `json:"cmd,omitempty"`
	WorkingDir string            `json:"working_dir,omitempty"`
	User       string            `json:"user,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
}

// Image is a resolved image version.
type Image struct {
	Ref      string      // NAME:TAG, or NAME@sha256:... when resolved by digest
	Digest   blob.Digest // of the manifest
	Manifest Manifest
	Owner    string
	Public   bool
}

// LayerDigests returns the layer digests bottom first.
func (im *Image) LayerDigests() []blob.Digest {
	out := make([]blob.Digest, len(im.Manifest.Layers))
	for i, l := range im.Manifest.Layers {
		out[i] = l.Digest
	}
	return out
}

var nameRE = regexp.MustCompile(`^[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$`)
var tagRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// ParseRef normalises NAME[:TAG] (default tag "latest") or NAME@DIGEST.
// It returns name, tag and digest (one of tag/digest is empty).
func ParseRef(ref string) (name, tag string, dgst blob.Digest, err error) {
	bad := func(why string) error {
		return fmt.Errorf("image reference %q: %s: %w", ref, why, errdefs.ErrInvalidArgument)
	}
	if n, d, ok := strings.Cut(ref, "@"); ok {
		if !nameRE.MatchString(n) {
			return "", "", "", bad("invalid name")
		}
		if blob.Digest(d).Validate() != nil {
			return "", "", "", bad("invalid digest")
		}
		return n, "", blob.Digest(d), nil
	}
	name, tag = ref, "latest"
	if i := strings.LastIndexByte(ref, ':'); i > strings.LastIndexByte(ref, '/') {
		name, tag = ref[:i], ref[i+1:]
	}
	if len(name) > 255 || !nameRE.MatchString(name) {
		return "", "", "", bad("invalid name (lowercase letters, digits, '.', '_', '-', '/')")
	}
	if !tagRE.MatchString(tag) {
		return "", "", "", bad("invalid tag")
	}
	return name, tag, "", nil
}

// NormalizeRef returns NAME:TAG for a tag reference.
func NormalizeRef(ref string) (string, error) {
	name, tag, d, err := ParseRef(ref)
	if err != nil {
		return "", err
	}
	if d != "" {
		return "", fmt.Errorf("image reference %q: a digest cannot be tagged: %w", ref, errdefs.ErrInvalidArgument)
	}
	return name + ":" + tag, nil
}

// Store keeps named, versioned images over a blob store (layers, chunks,
// manifests) and a metadata store (tags). Writers (imports, commits) and
// GC exclude each other within a process; across processes GC spares
// blobs younger than its grace period.
type Store struct {
	blobs blob.Store
	meta  MetaStore
	log   *slog.Logger
	cfg   storeConfig

	// gcMu: writers hold it shared for their whole run, GC exclusively,
	// so a GC never sweeps chunks an in-flight import has written but not
	// yet referenced from a tag.
	gcMu sync.RWMutex
}

type storeConfig struct {
	chunkSize   int64
	compress    bool
	keepDevices bool
	workers     int
	tmpDir      string
}

// Opt configures a Store.
type Opt func(*Store) error

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Opt { return func(s *Store) error { s.log = l; return nil } }

// WithChunkSize sets the chunk size of new layers (1-4 MiB).
func WithChunkSize(n int64) Opt {
	return func(s *Store) error {
		if n < MinChunkSize || n > MaxChunkSize {
			return fmt.Errorf("chunk size %d outside %d..%d: %w", n, MinChunkSize, MaxChunkSize, errdefs.ErrInvalidArgument)
		}
		s.cfg.chunkSize = n
		return nil
	}
}

// WithCompression turns zstd chunk compression on or off (on by default;
// chunks are compressed only when that saves space).
func WithCompression(on bool) Opt { return func(s *Store) error { s.cfg.compress = on; return nil } }

// WithKeepDevices keeps block and character device nodes found in images
// (dropped by default: a sandbox gets its devices from the runtime).
func WithKeepDevices(on bool) Opt { return func(s *Store) error { s.cfg.keepDevices = on; return nil } }

// WithWorkers sets how many chunks are hashed/compressed/stored at once.
func WithWorkers(n int) Opt { return func(s *Store) error { s.cfg.workers = n; return nil } }

// WithTempDir sets where uploads and OCI archives are spooled during
// import ("" = os.TempDir()).
func WithTempDir(dir string) Opt { return func(s *Store) error { s.cfg.tmpDir = dir; return nil } }

// NewStore returns an image store.
func NewStore(blobs blob.Store, meta MetaStore, opts ...Opt) (*Store, error) {
	s := &Store{blobs: blobs, meta: meta, cfg: storeConfig{chunkSize: DefaultChunkSize, compress: true, workers: 4}}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.cfg.tmpDir != "" {
		if err := os.MkdirAll(s.cfg.tmpDir, 0o700); err != nil {
			return nil, fmt.Errorf("image store: temp dir: %w", err)
		}
	}
	return s, nil
}

// Blobs returns the underlying blob store (layer providers read from it).
func (s *Store) Blobs() blob.Store { return s.blobs }

func (s *Store) buildConfig(progress func(int64)) buildConfig {
	return buildConfig{
		chunkSize:   s.cfg.chunkSize,
		compress:    s.cfg.compress,
		keepDevices: s.cfg.keepDevices,
		workers:     s.cfg.workers,
		log:         s.log,
		progress:    progress,
	}
}

// putIndex stores a finished index and returns its layer digest.
func putIndex(ctx context.Context, w blob.Writer, ix *Index) (blob.Digest, error) {
	b, err := encodeIndex(ix)
	if err != nil {
		return "", err
	}
	d := blob.FromBytes(b)
	if _, err := w.Put(ctx, d, bytes.NewReader(b)); err != nil {
		return "", fmt.Errorf("store layer index: %w", err)
	}
	return d, nil
}

// ReadManifest reads and verifies an image manifest blob.
func ReadManifest(ctx context.Context, r blob.Reader, d blob.Digest) (*Manifest, error) {
	b, err := blob.ReadAll(ctx, r, d)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", d, err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil || m.MediaType != ManifestMediaType {
		return nil, fmt.Errorf("manifest %s: not a dsec image manifest: %w", d, errdefs.ErrInvalidArgument)
	}
	return &m, nil
}

// tagOpts are the ownership settings of a new tag.
type tagOpts struct {
	owner  string
	public bool
}

// writeImage stores a manifest and points ref at it. The caller holds
// gcMu shared.
func (s *Store) writeImage(ctx context.Context, ref string, m *Manifest, to tagOpts) (*Image, error) {
	m.MediaType = ManifestMediaType
	if m.Created.IsZero() {
		m.Created = time.Now().UTC()
	}
	m.Size = 0
	for _, l := range m.Layers {
		m.Size += l.Size
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	d := blob.FromBytes(b)
	if _, err := s.blobs.Put(ctx, d, bytes.NewReader(b)); err != nil {
		return nil, fmt.Errorf("store manifest: %w", err)
	}
	rec := Record{Ref: ref, Manifest: d, Owner: to.owner, Public: to.public, Updated: time.Now().UTC()}
	if err := s.meta.PutRef(ctx, rec); err != nil {
		return nil, fmt.Errorf("tag %s: %w", ref, err)
	}
	s.log.Info("image version written", "ref", ref, "manifest", d, "layers", len(m.Layers))
	return &Image{Ref: ref, Digest: d, Manifest: *m, Owner: to.owner, Public: to.public}, nil
}

// Resolve returns the image version a reference names: NAME[:TAG] via the
// tag, NAME@sha256:... directly by manifest digest (any version still in
// the blob store).
func (s *Store) Resolve(ctx context.Context, ref string) (*Image, error) {
	name, tag, d, err := ParseRef(ref)
	if err != nil {
		return nil, err
	}
	im := &Image{Ref: name + "@" + string(d), Digest: d}
	if d == "" {
		rec, err := s.meta.GetRef(ctx, name+":"+tag)
		if err != nil {
			return nil, err
		}
		im = &Image{Ref: rec.Ref, Digest: rec.Manifest, Owner: rec.Owner, Public: rec.Public}
	}
	m, err := ReadManifest(ctx, s.blobs, im.Digest)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("image %s: %w", ref, err)
		}
		return nil, err
	}
	im.Manifest = *m
	return im, nil
}

// List returns every tagged image version, sorted by reference.
func (s *Store) List(ctx context.Context) ([]Image, error) {
	recs, err := s.meta.ListRefs(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Image, 0, len(recs))
	for _, r := range recs {
		m, err := ReadManifest(ctx, s.blobs, r.Manifest)
		if err != nil {
			s.log.Warn("image manifest unreadable", "ref", r.Ref, "err", err)
			continue
		}
		out = append(out, Image{Ref: r.Ref, Digest: r.Manifest, Manifest: *m, Owner: r.Owner, Public: r.Public})
	}
	slices.SortFunc(out, func(a, b Image) int { return strings.Compare(a.Ref, b.Ref) })
	return out, nil
}

// Remove deletes a tag. Its blobs go at the next GC unless still
// referenced.
func (s *Store) Remove(ctx context.Context, ref string) error {
	r, err := NormalizeRef(ref)
	if err != nil {
		return err
	}
	return s.meta.DeleteRef(ctx, r)
}

// Tag points dst at the version src resolves to (a new version name for
// the same manifest).
func (s *Store) Tag(ctx context.Context, src, dst string) (*Image, error) {
	s.gcMu.RLock()
	defer s.gcMu.RUnlock()
	im, err := s.Resolve(ctx, src)
	if err != nil {
		return nil, err
	}
	dst, err = NormalizeRef(dst)
	if err != nil {
		return nil, err
	}
	m := im.Manifest
	return s.writeImage(ctx, dst, &m, tagOpts{owner: im.Owner, public: im.Public})
}

// WithLayers writes a new image version ref whose layers are base's with
// the given replacements (index -> layer digest, bottom = 0) and appended
// layers on top. Untouched layers are shared as they are.
func (s *Store) WithLayers(ctx context.Context, base, ref string, replace map[int]blob.Digest, appendLayers ...blob.Digest) (*Image, error) {
	s.gcMu.RLock()
	defer s.gcMu.RUnlock()
	b, err := s.Resolve(ctx, base)
	if err != nil {
		return nil, err
	}
	ref, err = NormalizeRef(ref)
	if err != nil {
		return nil, err
	}
	m := Manifest{Parent: b.Digest, Config: b.Manifest.Config, Source: "derived from " + b.Ref}
	m.Layers = slices.Clone(b.Manifest.Layers)
	lref := func(d blob.Digest) (LayerRef, error) {
		ix, err := ReadIndex(ctx, s.blobs, d)
		if err != nil {
			return LayerRef{}, err
		}
		return LayerRef{Digest: d, Size: ix.Size}, nil
	}
	for i, d := range replace {
		if i < 0 || i >= len(m.Layers) {
			return nil, fmt.Errorf("layer %d: image %s has %d layers: %w", i, base, len(m.Layers), errdefs.ErrInvalidArgument)
		}
		if m.Layers[i], err = lref(d); err != nil {
			return nil, err
		}
	}
	for _, d := range appendLayers {
		l, err := lref(d)
		if err != nil {
			return nil, err
		}
		m.Layers = append(m.Layers, l)
	}
	return s.writeImage(ctx, ref, &m, tagOpts{owner: b.Owner, public: b.Public})
}
