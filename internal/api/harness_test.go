package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/node/nodetest"
	"github.com/dsec-dev/dsec/internal/store"
	"github.com/dsec-dev/dsec/internal/store/bolt"
)

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// fakeImages is an in-memory ImageManager.
type fakeImages struct {
	mu     sync.Mutex
	images map[string]ImageInfo
}

func newFakeImages(refs ...string) *fakeImages {
	f := &fakeImages{images: map[string]ImageInfo{}}
	for _, r := range refs {
		f.images[r] = ImageInfo{Name: r, Digest: "sha256:" + r, Layers: []string{"l1"}}
	}
	return f
}

func (f *fakeImages) ImportPath(ctx context.Context, ref, path string, progress func(ImportProgress)) (*ImageInfo, error) {
	return f.add(ref, 0, progress)
}

func (f *fakeImages) ImportTar(ctx context.Context, ref string, r io.Reader, progress func(ImportProgress)) (*ImageInfo, error) {
	buf := make([]byte, 32<<10)
	var n int64
	for {
		m, err := r.Read(buf)
		n += int64(m)
		if m > 0 {
			progress(ImportProgress{Layer: 1, Layers: 1, Bytes: n})
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("empty tar: %w", errdefs.ErrInvalidArgument)
	}
	return f.add(ref, n, progress)
}

func (f *fakeImages) add(ref string, size int64, progress func(ImportProgress)) (*ImageInfo, error) {
	progress(ImportProgress{Layer: 1, Layers: 1, Bytes: size, Done: true})
	f.mu.Lock()
	defer f.mu.Unlock()
	info := ImageInfo{Name: ref, Digest: "sha256:" + ref, Size: size}
	f.images[ref] = info
	return &info, nil
}

func (f *fakeImages) Resolve(ctx context.Context, ref string) (*ImageInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	info, ok := f.images[ref]
	if !ok {
		return nil, fmt.Errorf("image %s: %w", ref, errdefs.ErrNotFound)
	}
	return &info, nil
}

func (f *fakeImages) List(ctx context.Context) ([]ImageInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []ImageInfo
	for _, i := range f.images {
		out = append(out, i)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (f *fakeImages) Remove(ctx context.Context, ref string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.images[ref]; !ok {
		return fmt.Errorf("image %s: %w", ref, errdefs.ErrNotFound)
	}
	delete(f.images, ref)
	return nil
}

func (f *fakeImages) GC(ctx context.Context) (*GCResult, error) { return &GCResult{KeptBlobs: 1}, nil }

func (f *fakeImages) Stats(ctx context.Context, ref string) (*ImageStats, error) {
	return &ImageStats{Image: ref}, nil
}

// env is a control plane on a bbolt store and a fake node, served over
// httptest (TCP: tokens required).
type env struct {
	t      testing.TB
	cfg    Config
	st     store.Store
	node   *nodetest.Fake
	images *fakeImages
	clock  *fakeClock
	svc    *ControlPlane
	srv    *httptest.Server
	admin  string // admin token
}

func newEnv(t testing.TB, mod ...func(*Config)) *env {
	t.Helper()
	dir := t.TempDir()
	st, err := bolt.Open(filepath.Join(dir, "state.db"), bolt.WithNoSync())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &env{
		t: t, st: st,
		node:   nodetest.New("node1", filepath.Join(dir, "node"), 8, 16<<30),
		images: newFakeImages("base:latest", "other:v1"),
		clock:  &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)},
	}
	e.cfg = Config{DataDir: filepath.Join(dir, "data"), Clock: e.clock, ReapInterval: time.Hour}
	for _, m := range mod {
		m(&e.cfg)
	}
	e.start()
	// base is public so every tenant can use it.
	if err := st.Put(context.Background(), store.BucketImageACL, "base", imageACL{Name: "base", Owner: AdminTenant, Public: true}); err != nil {
		t.Fatal(err)
	}
	tok, err := e.svc.CreateToken(context.Background(), AdminCaller, AdminTenant)
	if err != nil {
		t.Fatal(err)
	}
	e.admin = tok.Secret
	return e
}

// start (re)starts the control plane and HTTP server on the env's store
// and node, as a server restart would.
func (e *env) start() {
	e.t.Helper()
	svc, err := NewService(e.cfg, e.st, StaticNodes{"node1": e.node}, e.images, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := svc.Start(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.svc = svc
	e.srv = httptest.NewServer(NewHandler(svc))
	e.t.Cleanup(e.stop)
}

func (e *env) stop() {
	if e.srv != nil {
		e.srv.Close()
		e.srv = nil
	}
	if e.svc != nil {
		e.svc.Close()
		e.svc = nil
	}
}

// tenant creates a tenant with a quota and returns a token for it.
func (e *env) tenant(name string, q Quota) string {
	e.t.Helper()
	ctx := context.Background()
	if _, err := e.svc.CreateTenant(ctx, AdminCaller, Tenant{Name: name, Quota: q}); err != nil {
		e.t.Fatal(err)
	}
	tok, err := e.svc.CreateToken(ctx, AdminCaller, name)
	if err != nil {
		e.t.Fatal(err)
	}
	return tok.Secret
}

type reply struct {
	status int
	body   []byte
	header http.Header
}

func (r reply) errBody(t *testing.T) ErrorBody {
	t.Helper()
	var eb ErrorBody
	if err := json.Unmarshal(r.body, &eb); err != nil {
		t.Fatalf("error body %q is not JSON: %v", r.body, err)
	}
	if strings.Count(strings.TrimSpace(string(r.body)), "\n") != 0 || eb.Error == "" || eb.Code == "" {
		t.Fatalf("error body is not one line with error and code: %q", r.body)
	}
	return eb
}

func (e *env) do(method, path, token string, body any) reply {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	case io.Reader:
		rd = b
	default:
		j, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return reply{status: resp.StatusCode, body: b, header: resp.Header}
}

// doJSON does a call that must answer want, decoding the reply into out.
func (e *env) doJSON(method, path, token string, body any, want int, out any) reply {
	e.t.Helper()
	r := e.do(method, path, token, body)
	if r.status != want {
		e.t.Fatalf("%s %s: status %d, want %d: %s", method, path, r.status, want, r.body)
	}
	if out != nil {
		if err := json.Unmarshal(r.body, out); err != nil {
			e.t.Fatalf("%s %s: decoding %q: %v", method, path, r.body, err)
		}
	}
	return r
}

func (e *env) create(token string, spec node.SandboxSpec) node.Sandbox {
	e.t.Helper()
	if spec.Image == "" {
		spec.Image = "base"
	}
	var sb node.Sandbox
	e.doJSON("POST", "/v1/sandboxes", token, spec, http.StatusCreated, &sb)
	return sb
}

func (e *env) records() int {
	e.t.Helper()
	n := 0
	if err := e.st.List(context.Background(), store.BucketSandboxes, "", func(string, []byte) error { n++; return nil }); err != nil {
		e.t.Fatal(err)
	}
	return n
}
