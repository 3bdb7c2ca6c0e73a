package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/md5"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// imageJSON is the CLI's JSON view of an image (client.ImageInfo).
type imageJSON struct {
	Name   string   `json:"name"`
	Digest string   `json:"digest"`
	Layers []string `json:"layers"`
	Size   int64    `json:"size"`
}

type statsJSON struct {
	Image        string `json:"image"`
	ImageBytes   int64  `json:"image_bytes"`
	FetchedBytes int64  `json:"fetched_bytes"`
	ReadBytes    int64  `json:"read_bytes"`
}

func decodeJSON[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("decoding %q: %v", s, err)
	}
	return v
}

// rootfs builds the small real rootfs under the server's dir, lets edit
// add to it, and returns its path.
func (s *server) rootfs(nameHint string, edit func(dir string)) string {
	s.t.Helper()
	dir := filepath.Join(s.dir, "rootfs-"+nameHint)
	if out, err := exec.Command(filepath.Join(repoRoot, "scripts", "mkrootfs.sh"), dir).CombinedOutput(); err != nil {
		s.t.Fatalf("mkrootfs: %v\n%s", err, out)
	}
	if edit != nil {
		edit(dir)
	}
	return dir
}

func (s *server) newSandbox(image string) string {
	s.t.Helper()
	return strings.TrimSpace(s.mustCLI("sandbox", "create", "--image", image, "--memory", "128Mi"))
}

// sh runs script in sandbox id and returns its stdout (fails on exit != 0).
func (s *server) sh(id, script string) string {
	s.t.Helper()
	return s.mustCLI("exec", id, "--", "sh", "-c", script)
}

func (s *server) inspect(ref string) imageJSON {
	s.t.Helper()
	return decodeJSON[imageJSON](s.t, s.mustCLI("image", "inspect", ref, "--json"))
}

func (s *server) stats(ref string) statsJSON {
	s.t.Helper()
	return decodeJSON[statsJSON](s.t, s.mustCLI("image", "stats", ref, "--json"))
}

func writeFile(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func tarDir(t *testing.T, dir, out string) {
	t.Helper()
	if b, err := exec.Command("tar", "--numeric-owner", "-C", dir, "-cf", out, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v\n%s", err, b)
	}
}

// tarLayer is an OCI layer built from entries in order (name -> content;
// a name ending in "/" is a directory).
func tarLayer(t *testing.T, entries [][2]string) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e[0], Mode: 0o644, Size: int64(len(e[1])), Typeflag: tar.TypeReg}
		if strings.HasSuffix(e[0], "/") {
			h.Typeflag, h.Mode, h.Size = tar.TypeDir, 0o755, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// ociImage is a two-layer image: the rootfs, then a layer that adds
// /etc/layer2, deletes /etc/gone (whiteout) and replaces /opt/d (opaque).
func ociImage(t *testing.T, rootfsTar string) v1.Image {
	t.Helper()
	base, err := tarball.LayerFromFile(rootfsTar)
	if err != nil {
		t.Fatal(err)
	}
	top := tarLayer(t, [][2]string{
		{"etc/", ""}, {"etc/layer2", "from layer 2\n"}, {"etc/.wh.gone", ""},
		{"opt/", ""}, {"opt/d/", ""}, {"opt/d/.wh..wh..opq", ""}, {"opt/d/c", "c\n"},
	})
	img, err := mutate.AppendLayers(empty.Image, base, top)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", goruntime.GOARCH
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// withOptD adds /etc/gone and /opt/d/{a,b} to a rootfs: what the OCI top
// layer and the snapshot test delete and replace.
func withOptD(t *testing.T) func(string) {
	return func(dir string) {
		writeFile(t, filepath.Join(dir, "etc/gone"), []byte("gone\n"))
		writeFile(t, filepath.Join(dir, "opt/d/a"), []byte("a\n"))
		writeFile(t, filepath.Join(dir, "opt/d/b"), []byte("b\n"))
	}
}

func TestImageImportFormats(t *testing.T) {
	s := startServer(t)
	dir := s.rootfs("formats", withOptD(t))
	rootTar := filepath.Join(s.dir, "rootfs.tar")
	tarDir(t, dir, rootTar)

	img := ociImage(t, rootTar)
	layoutDir := filepath.Join(s.dir, "oci")
	lp, err := layout.Write(layoutDir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	ociTar := filepath.Join(s.dir, "oci.tar")
	tarDir(t, layoutDir, ociTar)
	dockerTar := filepath.Join(s.dir, "docker.tar")
	tag, err := name.NewTag("e2e/docker:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(dockerTar, tag, img); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		ref, path string
		layers    int
		oci       bool
	}{
		{"fmt/dir:1", dir, 1, false},
		{"fmt/tar:1", rootTar, 1, false},
		{"fmt/layout:1", layoutDir, 2, true},
		{"fmt/ociarchive:1", ociTar, 2, true},
		{"fmt/docker:1", dockerTar, 2, true},
	} {
		t.Run(tc.ref, func(t *testing.T) {
			stored := dirBytes(t, filepath.Join(s.dataDir, "blobs"))
			out := s.mustCLI("image", "import", tc.ref, tc.path, "--json")
			got := decodeJSON[imageJSON](t, out)
			if got.Name != tc.ref || len(got.Layers) != tc.layers || got.Size <= 0 {
				t.Fatalf("import %s: %+v", tc.path, got)
			}
			// Chunks are deduplicated: the rootfs imported again (as a tar
			// now) adds little more than its index and manifest.
			if grew := dirBytes(t, filepath.Join(s.dataDir, "blobs")) - stored; tc.ref == "fmt/tar:1" && grew > got.Size/10 {
				t.Errorf("re-importing the same rootfs stored %d more bytes (image %d)", grew, got.Size)
			}
			id := s.newSandbox(tc.ref)
			defer s.mustCLI("sandbox", "rm", id)
			want := "gone\na\nb\n"
			script := "cat /etc/gone /opt/d/a /opt/d/b"
			if tc.oci {
				// The top layer's whiteout and opaque dir apply.
				want = "from layer 2\nabsent\nc\n"
				script = "cat /etc/layer2; [ -e /etc/gone ] || echo absent; ls /opt/d"
			}
			if got := s.sh(id, script); got != want {
				t.Fatalf("%s in the sandbox: %q, want %q", tc.ref, got, want)
			}
		})
	}

	// Bad input is refused with a clear one-line error and leaves no image
	// behind (the mechanisms' own tests cover every case; these go
	// through the CLI and the server).
	b, err := os.ReadFile(dockerTar)
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(s.dir, "truncated.tar")
	writeFile(t, cut, b[:len(b)/2])
	escape := filepath.Join(s.dir, "escape.tar")
	writeTarFile(t, escape, "../evil", "x")
	absolute := filepath.Join(s.dir, "absolute.tar")
	writeTarFile(t, absolute, "/etc/evil", "x")
	// A layout whose top layer blob does not match its digest.
	badLayout := filepath.Join(s.dir, "oci-bad")
	if out, err := exec.Command("cp", "-a", layoutDir, badLayout).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	top, err := layers[1].Digest()
	if err != nil {
		t.Fatal(err)
	}
	topPath := filepath.Join(badLayout, "blobs", top.Algorithm, top.Hex)
	tb, err := os.ReadFile(topPath)
	if err != nil {
		t.Fatal(err)
	}
	tb[len(tb)/2] ^= 0xff
	writeFile(t, topPath, tb)

	for _, bad := range []struct{ path, want string }{
		{cut, "truncated|unexpected EOF"},
		{escape, "escapes"},
		{absolute, "absolute"},
		{badLayout, "digest|hashes to"},
	} {
		_, errOut, code := s.cli("image", "import", "fmt/bad:1", bad.path)
		if code == 0 || !matchesAny(errOut, bad.want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("import %s: exit %d: %q (want a one-line error matching %s)", filepath.Base(bad.path), code, errOut, bad.want)
		}
	}
	if out := s.mustCLI("image", "ls"); strings.Contains(out, "fmt/bad") {
		t.Fatalf("a failed import left an image: %s", out)
	}
}

func matchesAny(s, alts string) bool {
	for _, a := range strings.Split(alts, "|") {
		if strings.Contains(s, a) {
			return true
		}
	}
	return false
}

// writeTarFile writes a one-entry tar.
func writeTarFile(t *testing.T, p, name, content string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(tw, content); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	writeFile(t, p, buf.Bytes())
}

func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err == nil {
			n += fi.Size()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// blobPath is where the default dir store keeps a blob.
func (s *server) blobPath(d string) string {
	h := strings.TrimPrefix(d, "sha256:")
	return filepath.Join(s.dataDir, "blobs", "sha256", h[:2], h)
}

func sha256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func md5Hex(b []byte) string {
	h := md5.Sum(b)
	return hex.EncodeToString(h[:])
}

func TestImageLsInspectRmGC(t *testing.T) {
	s := startServer(t)
	s.mustCLI("image", "import", "gc/base:1", s.rootfs("base", nil))
	// Random content does not compress: its chunks are stored raw, named
	// by the digest of their bytes.
	unique := randomBytes(t, 1<<20)
	chunk := "sha256:" + sha256Hex(unique)
	s.mustCLI("image", "import", "gc/extra:1", s.rootfs("extra", func(d string) {
		writeFile(t, filepath.Join(d, "data/unique.bin"), unique)
	}))

	imgs := decodeJSON[[]imageJSON](t, s.mustCLI("image", "ls", "--json"))
	var names []string
	for _, im := range imgs {
		names = append(names, im.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"gc/base:1", "gc/extra:1"}) {
		t.Fatalf("image ls: %v", names)
	}
	extra := s.inspect("gc/extra:1")
	if !strings.HasPrefix(extra.Digest, "sha256:") || len(extra.Layers) != 1 || extra.Size < 1<<20 {
		t.Fatalf("inspect: %+v", extra)
	}
	if _, err := os.Stat(s.blobPath(chunk)); err != nil {
		t.Fatalf("the unique chunk is not in the store: %v", err)
	}

	// A running sandbox keeps its image's blobs through rm + gc, even those
	// it has not read yet.
	id := s.newSandbox("gc/extra:1")
	s.mustCLI("image", "rm", "gc/extra:1")
	if _, _, code := s.cli("image", "inspect", "gc/extra:1"); code == 0 {
		t.Fatal("inspect after rm succeeded")
	}
	s.mustCLI("image", "gc")
	if _, err := os.Stat(s.blobPath(chunk)); err != nil {
		t.Fatalf("gc removed a chunk a running sandbox uses: %v", err)
	}
	if got := s.sh(id, "md5sum < /data/unique.bin"); !strings.HasPrefix(got, md5Hex(unique)) {
		t.Fatalf("unique.bin after gc: %q", got)
	}

	// Once nothing references them, gc removes them, and only them.
	s.mustCLI("sandbox", "rm", id)
	res := decodeJSON[struct {
		RemovedBlobs int   `json:"removed_blobs"`
		FreedBytes   int64 `json:"freed_bytes"`
	}](t, s.mustCLI("image", "gc", "--json"))
	if res.RemovedBlobs < 2 || res.FreedBytes < 1<<20 { // the chunk, the layer index, the manifest
		t.Fatalf("gc: %+v", res)
	}
	if _, err := os.Stat(s.blobPath(chunk)); !os.IsNotExist(err) {
		t.Fatalf("unreferenced chunk still there: %v", err)
	}
	id = s.newSandbox("gc/base:1")
	if got := s.sh(id, "cat /etc/passwd | head -1"); !strings.HasPrefix(got, "root:") {
		t.Fatalf("base image after gc: %q", got)
	}
	if _, errOut, code := s.cli("image", "rm", "gc/nope:1"); code == 0 || !strings.Contains(errOut, "not found") {
		t.Fatalf("rm of a missing image: exit %d %s", code, errOut)
	}
}

func TestImageStatsLazy(t *testing.T) {
	s := startServer(t)
	big := randomBytes(t, 8<<20)
	s.mustCLI("image", "import", "lazy:1", s.rootfs("lazy", func(d string) {
		writeFile(t, filepath.Join(d, "data/big.bin"), big)
	}))
	before := s.stats("lazy:1")
	if before.ImageBytes < 8<<20 || before.FetchedBytes != 0 {
		t.Fatalf("stats before any sandbox: %+v", before)
	}
	id := s.newSandbox("lazy:1")
	if got := s.sh(id, "head -c 5 /etc/passwd"); got != "root:" {
		t.Fatalf("read: %q", got)
	}
	one := s.stats("lazy:1")
	if one.FetchedBytes <= 0 || one.ReadBytes <= 0 || one.FetchedBytes >= one.ImageBytes/2 {
		t.Fatalf("after reading one file: %+v (want 0 < fetched < image/2)", one)
	}
	// Reading the big file fetches it, once.
	if got := s.sh(id, "md5sum < /data/big.bin"); !strings.HasPrefix(got, md5Hex(big)) {
		t.Fatalf("big.bin: %q", got)
	}
	two := s.stats("lazy:1")
	if two.FetchedBytes < one.FetchedBytes+8<<20 || two.ReadBytes < one.ReadBytes+8<<20 {
		t.Fatalf("after reading big.bin: %+v (before %+v)", two, one)
	}
	id2 := s.newSandbox("lazy:1")
	s.sh(id2, "cat /data/big.bin > /dev/null")
	three := s.stats("lazy:1")
	if three.FetchedBytes > two.FetchedBytes+1<<20 {
		t.Fatalf("a second sandbox fetched again: %+v (before %+v)", three, two)
	}
	// The same figures on /metrics.
	metrics := s.metrics()
	for _, want := range []string{
		fmt.Sprintf(`dsec_image_fetched_bytes{image="lazy:1"} %s`, promFloat(three.FetchedBytes)),
		fmt.Sprintf(`dsec_image_bytes{image="lazy:1"} %s`, promFloat(three.ImageBytes)),
	} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// promFloat formats n as the Prometheus text format does.
func promFloat(n int64) string { return strconv.FormatFloat(float64(n), 'g', -1, 64) }

// metrics fetches the server's /metrics over its unix socket.
func (s *server) metrics() string {
	s.t.Helper()
	sock := strings.TrimPrefix(s.addr, "unix://")
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := hc.Get("http://dsec/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		s.t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	return string(b)
}

func TestSnapshotCommitsPrivateLayer(t *testing.T) {
	s := startServer(t)
	s.mustCLI("image", "import", "snap/base:1", s.rootfs("snap", withOptD(t)))
	base := s.inspect("snap/base:1")

	id := s.newSandbox("snap/base:1")
	s.sh(id, `echo extra >> /etc/passwd && echo new > /etc/added &&
		rm /etc/gone && rm -rf /opt/d && mkdir /opt/d && echo c > /opt/d/c`)
	out := s.mustCLI("sandbox", "snapshot", id, "snap/child:1", "--json")
	snap := decodeJSON[imageJSON](t, out)
	if snap.Name != "snap/child:1" || len(snap.Layers) != len(base.Layers)+1 || snap.Layers[0] != base.Layers[0] {
		t.Fatalf("snapshot %+v on base %+v", snap, base)
	}
	// The source keeps running with its state.
	if got := s.sh(id, "tail -1 /etc/passwd"); got != "extra\n" {
		t.Fatalf("source after snapshot: %q", got)
	}

	const probe = "tail -1 /etc/passwd; cat /etc/added 2>/dev/null; [ -e /etc/gone ] && echo gone-present; ls /opt/d"
	child := s.newSandbox("snap/child:1")
	if got := s.sh(child, probe); got != "extra\nnew\nc\n" {
		t.Fatalf("sandbox from the snapshot sees %q", got)
	}
	// The base image is unchanged.
	fresh := s.newSandbox("snap/base:1")
	if got := s.sh(fresh, probe); got != "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\ngone-present\na\nb\n" {
		t.Fatalf("sandbox from the base sees %q", got)
	}
	if again := s.inspect("snap/base:1"); again.Digest != base.Digest {
		t.Fatalf("base changed: %s -> %s", base.Digest, again.Digest)
	}
	// A snapshot of a snapshot stacks one more layer.
	s.sh(child, "echo grandchild > /etc/added")
	gc := decodeJSON[imageJSON](t, s.mustCLI("sandbox", "snapshot", child, "snap/child:2", "--json"))
	if len(gc.Layers) != len(snap.Layers)+1 {
		t.Fatalf("snapshot of a snapshot: %+v", gc)
	}
	g := s.newSandbox("snap/child:2")
	if got := s.sh(g, probe); got != "extra\ngrandchild\nc\n" {
		t.Fatalf("sandbox from the second snapshot sees %q", got)
	}
}

func TestForkRunningAndPaused(t *testing.T) {
	s := startServer(t)
	s.importTestImage("fork:1")
	src := s.newSandbox("fork:1")
	s.sh(src, "echo state > /workspace/state && rm /etc/group && echo unread > /workspace/unread")

	fork := func(from string) []string {
		t.Helper()
		sbs := decodeJSON[[]struct {
			ID    string `json:"id"`
			State string `json:"state"`
		}](t, s.mustCLI("sandbox", "fork", from, "--count", "3", "--json"))
		var ids []string
		for _, sb := range sbs {
			if sb.State != "running" {
				t.Fatalf("fork %s is %s", sb.ID, sb.State)
			}
			ids = append(ids, sb.ID)
		}
		if len(ids) != 3 {
			t.Fatalf("fork --count 3 gave %d sandboxes", len(ids))
		}
		return ids
	}
	check := func(ids []string, want string) {
		t.Helper()
		for i, id := range ids {
			if got := s.sh(id, "cat /workspace/state; [ -e /etc/group ] || echo no-group"); got != want {
				t.Fatalf("fork %d (%s) sees %q, want %q", i, id, got, want)
			}
			// Each fork writes its own file: the others must not see it.
			s.sh(id, fmt.Sprintf("echo %d > /workspace/mine && echo changed-%d >> /workspace/state", i, i))
		}
		for i, id := range ids {
			if got := s.sh(id, "cat /workspace/mine; cat /workspace/state"); got != fmt.Sprintf("%d\n%schanged-%d\n", i, want[:strings.Index(want, "\n")+1], i) {
				t.Fatalf("fork %d is not independent: %q", i, got)
			}
		}
	}

	running := fork(src)
	// The forks' shared snapshot is no image of its own: not listed, yet
	// kept by gc while forks run on it.
	if out := s.mustCLI("image", "ls"); strings.Contains(out, "dsec-fork") {
		t.Fatalf("image ls shows the hidden fork image:\n%s", out)
	}
	s.mustCLI("image", "gc")
	if got := s.sh(running[2], "cat /workspace/unread"); got != "unread\n" {
		t.Fatalf("a fork after gc: %q", got)
	}
	check(running, "state\nno-group\n")
	if got := s.sh(src, "cat /workspace/state; [ -e /workspace/mine ] && echo leaked; true"); got != "state\n" {
		t.Fatalf("the source saw its forks' writes: %q", got)
	}
	// Writes of the source after the fork do not reach the forks.
	s.sh(src, "echo later > /workspace/later")
	if _, _, code := s.cli("exec", running[0], "--", "cat", "/workspace/later"); code == 0 {
		t.Fatal("a fork sees a file its source wrote after the fork")
	}

	s.sh(src, "echo paused-state > /workspace/state")
	s.mustCLI("sandbox", "pause", src)
	paused := fork(src)
	check(paused, "paused-state\nno-group\n")
	sb := decodeJSON[struct {
		State string `json:"state"`
	}](t, s.mustCLI("sandbox", "inspect", src, "--json"))
	if sb.State != "paused" {
		t.Fatalf("the paused source is %s after the fork", sb.State)
	}
	s.mustCLI("sandbox", "resume", src)
	if got := s.sh(src, "cat /workspace/state /workspace/later"); got != "paused-state\nlater\n" {
		t.Fatalf("source after resume: %q", got)
	}
}

func TestCorruptChunkGivesEIO(t *testing.T) {
	s := startServer(t)
	data := randomBytes(t, 3<<20) // three 1 MiB chunks, stored raw
	s.mustCLI("image", "import", "bad:1", s.rootfs("bad", func(d string) {
		writeFile(t, filepath.Join(d, "data/x.bin"), data)
	}))
	s.importTestImage("good:1")

	// Flip the bytes of the first chunk's blob in the store.
	chunk := "sha256:" + sha256Hex(data[:1<<20])
	p := s.blobPath(chunk)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("chunk blob: %v", err)
	}
	for i := range b {
		b[i] ^= 0xff
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}

	bad := s.newSandbox("bad:1")
	good := s.newSandbox("good:1")
	_, errOut, code := s.cli("exec", bad, "--", "sh", "-c", "cat /data/x.bin > /dev/null")
	if code == 0 || !strings.Contains(errOut, "I/O error") && !strings.Contains(errOut, "Input/output error") {
		t.Fatalf("reading the corrupt chunk: exit %d, stderr %q (want EIO)", code, errOut)
	}
	// Never wrong data: the same read again still fails.
	if _, _, code := s.cli("exec", bad, "--", "sh", "-c", "head -c 4096 /data/x.bin > /dev/null"); code == 0 {
		t.Fatal("a second read of the corrupt chunk succeeded")
	}
	// The other chunks of that file, other files, and other images work.
	if got := s.sh(bad, "dd if=/data/x.bin bs=1048576 skip=1 count=1 2>/dev/null | md5sum"); !strings.HasPrefix(got, md5Hex(data[1<<20:2<<20])) {
		t.Fatalf("the healthy second chunk: %q", got)
	}
	if got := s.sh(bad, "head -1 /etc/passwd"); !strings.HasPrefix(got, "root:") {
		t.Fatalf("another file of the image: %q", got)
	}
	if got := s.sh(good, "head -1 /etc/passwd && ls /bin | wc -l"); !strings.HasPrefix(got, "root:") {
		t.Fatalf("another image: %q", got)
	}
	// The log names the chunk.
	logb, _ := os.ReadFile(filepath.Join(s.dataDir, "layerd.log"))
	if !bytes.Contains(logb, []byte(chunk)) {
		t.Fatalf("layerd.log does not name the corrupt chunk %s:\n%s", chunk, logb)
	}
}

func TestImagePullFromRegistry(t *testing.T) {
	s := startServer(t)
	dir := s.rootfs("pull", func(d string) { writeFile(t, filepath.Join(d, "etc/pulled"), []byte("pulled\n")) })
	rootTar := filepath.Join(s.dir, "pull.tar")
	tarDir(t, dir, rootTar)
	img := ociImage(t, rootTar)

	// go-containerregistry's in-memory registry on loopback.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := httptest.NewUnstartedServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	reg.Listener.Close()
	reg.Listener = ln
	reg.Start()
	t.Cleanup(reg.Close)
	host := ln.Addr().String()
	src := host + "/e2e/pulled:1"
	tag, err := name.NewTag(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img); err != nil {
		t.Fatal(err)
	}

	got := decodeJSON[imageJSON](t, s.mustCLI("image", "pull", src, "--json"))
	if got.Name != "e2e/pulled:1" || len(got.Layers) != 2 {
		t.Fatalf("pull: %+v", got)
	}
	id := s.newSandbox("e2e/pulled:1")
	if out := s.sh(id, "cat /etc/pulled /etc/layer2; ls /opt/d"); out != "pulled\nfrom layer 2\nc\n" {
		t.Fatalf("pulled image: %q", out)
	}
	_, errOut, code := s.cli("image", "pull", host+"/e2e/missing:1")
	if code == 0 || !strings.Contains(errOut, "not found") {
		t.Fatalf("pull of a missing image: exit %d: %s", code, errOut)
	}
}
