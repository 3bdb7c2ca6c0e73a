package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/dsec-dev/dsec/internal/api"
	"github.com/dsec-dev/dsec/internal/api/e2b/proto/filesystem/filesystemconnect"
	"github.com/dsec-dev/dsec/internal/api/e2b/proto/process/processconnect"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node/nodetest"
	"github.com/dsec-dev/dsec/internal/store/bolt"
)

// images is an in-memory api.ImageManager holding what was imported.
type images struct {
	mu sync.Mutex
	m  map[string]api.ImageInfo
}

func (f *images) ImportPath(ctx context.Context, ref, path string, progress func(api.ImportProgress)) (*api.ImageInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	info := api.ImageInfo{Name: ref, Digest: "sha256:" + ref, Layers: []string{"l1"}}
	f.m[ref] = info
	if progress != nil {
		progress(api.ImportProgress{Layer: 1, Layers: 1, Done: true})
	}
	return &info, nil
}

func (f *images) ImportTar(ctx context.Context, ref string, r io.Reader, progress func(api.ImportProgress)) (*api.ImageInfo, error) {
	return f.ImportPath(ctx, ref, "", progress)
}

func (f *images) Resolve(ctx context.Context, ref string) (*api.ImageInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	info, ok := f.m[ref]
	if !ok {
		return nil, fmt.Errorf("image %s: %w", ref, errdefs.ErrNotFound)
	}
	return &info, nil
}

func (f *images) List(ctx context.Context) ([]api.ImageInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []api.ImageInfo
	for _, i := range f.m {
		out = append(out, i)
	}
	return out, nil
}

func (f *images) Remove(ctx context.Context, ref string) error { return nil }
func (f *images) GC(ctx context.Context) (*api.GCResult, error) {
	return &api.GCResult{}, nil
}
func (f *images) Stats(ctx context.Context, ref string) (*api.ImageStats, error) {
	return &api.ImageStats{Image: ref}, nil
}

// env is the E2B handler over the real control plane and a fake node,
// served over httptest.
type env struct {
	t    testing.TB
	svc  *api.ControlPlane
	node *nodetest.Fake
	h    *Handler
	srv  *httptest.Server
}

func newEnv(t testing.TB) *env {
	t.Helper()
	dir := t.TempDir()
	st, err := bolt.Open(filepath.Join(dir, "state.db"), bolt.WithNoSync())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &env{t: t, node: nodetest.New("node1", filepath.Join(dir, "node"), 8, 16<<30)}
	svc, err := api.NewService(api.Config{DataDir: filepath.Join(dir, "data")}, st,
		api.StaticNodes{"node1": e.node}, &images{m: map[string]api.ImageInfo{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.svc = svc
	e.h = NewHandler(svc)
	e.srv = httptest.NewServer(e.h)
	t.Cleanup(func() {
		e.srv.Close()
		e.h.Close()
		svc.Close()
	})
	if _, err := svc.ImportImage(context.Background(), api.AdminCaller, "base", "/nowhere", nil, true, nil); err != nil {
		t.Fatal(err)
	}
	return e
}

// key creates a tenant and an E2B API key for it.
func (e *env) key(tenant string) string {
	e.t.Helper()
	ctx := context.Background()
	if _, err := e.svc.CreateTenant(ctx, api.AdminCaller, api.Tenant{Name: tenant}); err != nil {
		e.t.Fatal(err)
	}
	tok, err := e.svc.CreateToken(ctx, api.AdminCaller, tenant, api.WithTokenPrefix(api.TokenPrefixE2B))
	if err != nil {
		e.t.Fatal(err)
	}
	return tok.Secret
}

// do sends a REST call and decodes a JSON reply into out (if non-nil).
func (e *env) do(method, path, key string, body any, out any) int {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = bytes.NewBufferString(b)
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
	if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 400 {
		var ae apiError
		if err := json.Unmarshal(b, &ae); err != nil || ae.Code != resp.StatusCode || ae.Message == "" {
			e.t.Errorf("%s %s: error body %q is not E2B's {code, message}", method, path, b)
		}
	}
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			e.t.Fatalf("%s %s: decoding %q: %v", method, path, b, err)
		}
	}
	return resp.StatusCode
}

// create makes a sandbox through the REST face and returns its reply.
func (e *env) create(key string, body map[string]any) sandboxReply {
	e.t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	if _, ok := body["templateID"]; !ok {
		body["templateID"] = "base"
	}
	var sb sandboxReply
	if code := e.do("POST", "/v2/sandboxes", key, body, &sb); code != http.StatusCreated {
		e.t.Fatalf("create: status %d", code)
	}
	return sb
}

// envd is a data-plane client for one sandbox, sending the headers the
// SDK sends.
type envd struct {
	proc processconnect.ProcessClient
	fs   filesystemconnect.FilesystemClient
	hdr  http.Header
	url  string
}

func (e *env) envd(sandboxID, token string) *envd {
	hdr := http.Header{}
	hdr.Set(headerSandboxID, sandboxID)
	hdr.Set("E2b-Sandbox-Port", "49983")
	if token != "" {
		hdr.Set(headerAccessToken, token)
	}
	opts := []connect.ClientOption{connect.WithProtoJSON(), connect.WithInterceptors(headerInterceptor(hdr))}
	return &envd{
		proc: processconnect.NewProcessClient(http.DefaultClient, e.srv.URL, opts...),
		fs:   filesystemconnect.NewFilesystemClient(http.DefaultClient, e.srv.URL, opts...),
		hdr:  hdr,
		url:  e.srv.URL,
	}
}

// headerInterceptor adds fixed headers to every call, unary or streaming.
type headerInterceptor http.Header

func (h headerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		for k, v := range h {
			req.Header()[k] = v
		}
		return next(ctx, req)
	}
}

func (h headerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		for k, v := range h {
			conn.RequestHeader()[k] = v
		}
		return conn
	}
}

func (h headerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// httpDo sends a plain data-plane request (files, health).
func (c *envd) httpDo(t *testing.T, method, path string, body io.Reader, ctype string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, c.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range c.hdr {
		req.Header[k] = v
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}
