package clienttest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/runtime"
)

// errorClasses maps errdefs classes to the contract's status and code, most
// specific first.
var errorClasses = []struct {
	class  error
	status int
	code   string
}{
	{errdefs.ErrInvalidArgument, 400, "invalid_argument"},
	{errdefs.ErrUnauthenticated, 401, "unauthenticated"},
	{errdefs.ErrPermissionDenied, 403, "permission_denied"},
	{errdefs.ErrNotFound, 404, "not_found"},
	{errdefs.ErrAlreadyExists, 409, "already_exists"},
	{errdefs.ErrFailedPrecondition, 409, "failed_precondition"},
	{errdefs.ErrResourceExhausted, 429, "resource_exhausted"},
	{errdefs.ErrNotImplemented, 501, "not_implemented"},
	{errdefs.ErrUnavailable, 503, "unavailable"},
	{errdefs.ErrDeadlineExceeded, 504, "deadline_exceeded"},
}

func classify(err error) (int, string) {
	for _, c := range errorClasses {
		if errors.Is(err, c.class) {
			return c.status, c.code
		}
	}
	return http.StatusInternalServerError, "internal"
}

func writeErr(w http.ResponseWriter, err error) {
	st, code := classify(err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(st)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error(), "code": code})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func badRequest(format string, a ...any) error {
	return fmt.Errorf(format+": %w", append(a, errdefs.ErrInvalidArgument)...)
}

// frames writes NDJSON frames, flushing each one.
type frames struct {
	mu  sync.Mutex
	w   http.ResponseWriter
	rc  *http.ResponseController
	enc *json.Encoder
}

func newFrames(w http.ResponseWriter) *frames {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	return &frames{w: w, rc: http.NewResponseController(w), enc: json.NewEncoder(w)}
}

func (f *frames) send(v any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enc.Encode(v); err != nil {
		return err
	}
	return f.rc.Flush()
}

func (f *frames) sendErr(err error) {
	_, code := classify(err)
	_ = f.send(map[string]string{"error": err.Error(), "code": code})
}

type streamWriter struct {
	f    *frames
	name string
}

func (s streamWriter) Write(p []byte) (int, error) {
	if err := s.f.send(map[string]any{"stream": s.name, "data": p}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// HandlerOptions configure Handler.
type HandlerOptions struct {
	// RequireAuth demands a bearer token on every call (the contract's TCP
	// listener); otherwise every caller is the admin (the unix socket).
	RequireAuth bool
}

type handler struct {
	svc  api.Service
	opts HandlerOptions
}

type route func(w http.ResponseWriter, r *http.Request, c api.Caller) error

// Handler serves the native HTTP contract over svc.
func Handler(svc api.Service, opts HandlerOptions) http.Handler {
	h := &handler{svc: svc, opts: opts}
	mux := http.NewServeMux()
	handle := func(pattern string, fn route) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			c, err := h.caller(r)
			if err == nil {
				err = fn(w, r, c)
			}
			if err != nil {
				writeErr(w, err)
			}
		})
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok\n") })

	handle("POST /v1/sandboxes", h.create)
	handle("GET /v1/sandboxes", h.list)
	handle("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		return reply(w, 200)(h.svc.GetSandbox(r.Context(), c, r.PathValue("id")))
	})
	handle("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		return noContent(w, h.svc.DeleteSandbox(r.Context(), c, r.PathValue("id")))
	})
	handle("POST /v1/sandboxes/{id}/pause", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		return noContent(w, h.svc.PauseSandbox(r.Context(), c, r.PathValue("id")))
	})
	handle("POST /v1/sandboxes/{id}/resume", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		return noContent(w, h.svc.ResumeSandbox(r.Context(), c, r.PathValue("id")))
	})
	handle("POST /v1/sandboxes/{id}/timeout", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		var b struct {
			Secs *int64 `json:"timeout_seconds"`
		}
		if err := decode(r, &b); err != nil {
			return err
		}
		if b.Secs == nil {
			return badRequest("timeout_seconds is required")
		}
		return noContent(w, h.svc.SetTimeout(r.Context(), c, r.PathValue("id"), time.Duration(*b.Secs)*time.Second))
	})
	handle("GET /v1/sandboxes/{id}/stats", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		return reply(w, 200)(h.svc.SandboxStats(r.Context(), c, r.PathValue("id")))
	})
	handle("PUT /v1/sandboxes/{id}/network", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		var p node.NetworkPolicy
		if err := decode(r, &p); err != nil {
			return err
		}
		return noContent(w, h.svc.SetNetwork(r.Context(), c, r.PathValue("id"), p))
	})
	handle("POST /v1/sandboxes/{id}/snapshot", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		var b struct {
			Image string `json:"image"`
		}
		if err := decode(r, &b); err != nil {
			return err
		}
		return reply(w, 200)(h.svc.Snapshot(r.Context(), c, r.PathValue("id"), b.Image))
	})
	handle("POST /v1/sandboxes/{id}/fork", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		var b struct {
			Count int `json:"count"`
		}
		if err := decode(r, &b); err != nil {
			return err
		}
		return reply(w, 200)(h.svc.Fork(r.Context(), c, r.PathValue("id"), b.Count))
	})
	handle("POST /v1/sandboxes/{id}/exec", h.exec)
	handle("GET /v1/sandboxes/{id}/execs", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		return reply(w, 200)(h.svc.ListExecs(r.Context(), c, r.PathValue("id")))
	})
	handle("GET /v1/sandboxes/{id}/execs/{eid}", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		return reply(w, 200)(h.svc.GetExec(r.Context(), c, r.PathValue("id"), r.PathValue("eid")))
	})
	handle("GET /v1/sandboxes/{id}/execs/{eid}/wait", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		return reply(w, 200)(h.svc.WaitExec(r.Context(), c, r.PathValue("id"), r.PathValue("eid")))
	})
	handle("POST /v1/sandboxes/{id}/execs/{eid}/signal", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		var b struct {
			Signal int `json:"signal"`
		}
		if err := decode(r, &b); err != nil {
			return err
		}
		return noContent(w, h.svc.SignalExec(r.Context(), c, r.PathValue("id"), r.PathValue("eid"), b.Signal))
	})
	h.fileRoutes(handle)
	h.imageRoutes(handle)
	h.adminRoutes(handle)
	return mux
}

func (h *handler) caller(r *http.Request) (api.Caller, error) {
	if !h.opts.RequireAuth {
		return api.AdminCaller, nil
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return api.Caller{}, fmt.Errorf("missing bearer token: %w", errdefs.ErrUnauthenticated)
	}
	return h.svc.Authenticate(r.Context(), tok)
}

func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("bad JSON body: %v", err)
	}
	return nil
}

func reply(w http.ResponseWriter, status int) func(any, error) error {
	return func(v any, err error) error {
		if err != nil {
			return err
		}
		writeJSON(w, status, v)
		return nil
	}
}

func noContent(w http.ResponseWriter, err error) error {
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *handler) create(w http.ResponseWriter, r *http.Request, c api.Caller) error {
	var spec node.SandboxSpec
	if err := decode(r, &spec); err != nil {
		return err
	}
	return reply(w, http.StatusCreated)(h.svc.CreateSandbox(r.Context(), c, spec))
}

func (h *handler) list(w http.ResponseWriter, r *http.Request, c api.Caller) error {
	f := api.ListFilter{State: r.URL.Query().Get("state"), Labels: map[string]string{}}
	for _, l := range r.URL.Query()["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return badRequest("label filter %q is not k=v", l)
		}
		f.Labels[k] = v
	}
	return reply(w, 200)(h.svc.ListSandboxes(r.Context(), c, f))
}

func (h *handler) exec(w http.ResponseWriter, r *http.Request, c api.Caller) error {
	br := bufio.NewReader(r.Body)
	line, err := br.ReadBytes('\n')
	if err != nil && !(err == io.EOF && len(line) > 0) {
		return badRequest("exec body must start with one JSON line: %v", err)
	}
	var req node.ExecRequest
	if err := json.Unmarshal(line, &req); err != nil {
		return badRequest("bad exec request: %v", err)
	}
	req.SandboxID = r.PathValue("id")
	// Output streams while stdin is still being read.
	_ = http.NewResponseController(w).EnableFullDuplex()
	var f *frames
	var once sync.Once
	start := func() { f = newFrames(w) }
	pw := &lazyFrames{start: func() *frames { once.Do(start); return f }}
	info, err := h.svc.StartExec(r.Context(), c, req, runtime.IO{
		Stdin: br, Stdout: streamWriter2{pw, "stdout"}, Stderr: streamWriter2{pw, "stderr"},
	})
	if err != nil {
		return err
	}
	fr := pw.start()
	_ = fr.send(map[string]any{"exec_id": info.ExecID, "pid": info.Pid})
	pw.ready()
	res, err := h.svc.WaitExec(r.Context(), c, req.SandboxID, info.ExecID)
	if err != nil {
		fr.sendErr(err)
		return nil
	}
	_ = fr.send(map[string]any{"result": res})
	return nil
}

// lazyFrames holds back output until the start frame is out: the process
// may write before StartExec returns.
type lazyFrames struct {
	start func() *frames
	mu    sync.Mutex
	ok    bool
	held  []map[string]any
}

func (l *lazyFrames) ready() {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.start()
	for _, m := range l.held {
		_ = f.send(m)
	}
	l.held, l.ok = nil, true
}

type streamWriter2 struct {
	l    *lazyFrames
	name string
}

func (s streamWriter2) Write(p []byte) (int, error) {
	s.l.mu.Lock()
	if !s.l.ok {
		s.l.held = append(s.l.held, map[string]any{"stream": s.name, "data": append([]byte(nil), p...)})
		s.l.mu.Unlock()
		return len(p), nil
	}
	s.l.mu.Unlock()
	return streamWriter{s.l.start(), s.name}.Write(p)
}

func (h *handler) fileRoutes(handle func(string, route)) {
	handle("GET /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		rc, fi, err := h.svc.ReadFile(r.Context(), c, r.PathValue("id"), r.URL.Query().Get("path"))
		if err != nil {
			return err
		}
		defer rc.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("X-Dsec-Mode", fmt.Sprintf("%04o", fi.Mode.Perm()))
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
		_, _ = io.Copy(w, rc)
		return nil
	})
	handle("PUT /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		mode := os.FileMode(0o644)
		if m := r.URL.Query().Get("mode"); m != "" {
			v, err := strconv.ParseUint(m, 8, 32)
			if err != nil || v > 0o7777 {
				return badRequest("mode %q is not an octal permission", m)
			}
			mode = os.FileMode(v)
		}
		return reply(w, 200)(h.svc.WriteFile(r.Context(), c, r.PathValue("id"), r.URL.Query().Get("path"), mode, r.Body))
	})
	handle("GET /v1/sandboxes/{id}/files/stat", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		return reply(w, 200)(h.svc.StatFile(r.Context(), c, r.PathValue("id"), r.URL.Query().Get("path")))
	})
	handle("GET /v1/sandboxes/{id}/files/list", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		depth := 1
		if d := r.URL.Query().Get("depth"); d != "" {
			v, err := strconv.Atoi(d)
			if err != nil {
				return badRequest("depth %q is not a number", d)
			}
			depth = v
		}
		return reply(w, 200)(h.svc.ListDir(r.Context(), c, r.PathValue("id"), r.URL.Query().Get("path"), depth))
	})
	handle("POST /v1/sandboxes/{id}/files/mkdir", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		var b struct {
			Path string `json:"path"`
			Mode uint32 `json:"mode"`
		}
		if err := decode(r, &b); err != nil {
			return err
		}
		if b.Mode == 0 {
			b.Mode = 0o755
		}
		return noContent(w, h.svc.MakeDir(r.Context(), c, r.PathValue("id"), b.Path, os.FileMode(b.Mode)))
	})
	handle("DELETE /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		rec := r.URL.Query().Get("recursive") == "true"
		return noContent(w, h.svc.Remove(r.Context(), c, r.PathValue("id"), r.URL.Query().Get("path"), rec))
	})
	handle("POST /v1/sandboxes/{id}/files/rename", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		var b struct {
			From string `json:"from"`
			To   string `json:"to"`
		}
		if err := decode(r, &b); err != nil {
			return err
		}
		return noContent(w, h.svc.Rename(r.Context(), c, r.PathValue("id"), b.From, b.To))
	})
}

func (h *handler) imageRoutes(handle func(string, route)) {
	handle("POST /v1/images/import", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		q := r.URL.Query()
		var body io.Reader
		if q.Get("path") == "" {
			body = r.Body
		}
		_ = http.NewResponseController(w).EnableFullDuplex()
		f := newFrames(w)
		img, err := h.svc.ImportImage(r.Context(), c, q.Get("ref"), q.Get("path"), body, q.Get("public") == "true",
			func(p api.ImportProgress) { _ = f.send(p) })
		if err != nil {
			f.sendErr(err)
			return nil
		}
		_ = f.send(map[string]any{"image": img})
		return nil
	})
	handle("GET /v1/images", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		return reply(w, 200)(h.svc.ListImages(r.Context(), c))
	})
	handle("POST /v1/images/gc", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		return reply(w, 200)(h.svc.GCImages(r.Context(), c))
	})
	handle("GET /v1/images/{ref}", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		return reply(w, 200)(h.svc.GetImage(r.Context(), c, r.PathValue("ref")))
	})
	handle("DELETE /v1/images/{ref}", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		return noContent(w, h.svc.RemoveImage(r.Context(), c, r.PathValue("ref")))
	})
	handle("GET /v1/images/{ref}/stats", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		return reply(w, 200)(h.svc.ImageStats(r.Context(), c, r.PathValue("ref")))
	})
}

func (h *handler) adminRoutes(handle func(string, route)) {
	handle("POST /v1/tenants", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		var t api.Tenant
		if err := decode(r, &t); err != nil {
			return err
		}
		return reply(w, 200)(h.svc.CreateTenant(r.Context(), c, t))
	})
	handle("GET /v1/tenants", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		return reply(w, 200)(h.svc.ListTenants(r.Context(), c))
	})
	handle("DELETE /v1/tenants/{name}", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		return noContent(w, h.svc.DeleteTenant(r.Context(), c, r.PathValue("name")))
	})
	handle("POST /v1/tokens", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		var b struct {
			Tenant string `json:"tenant"`
			E2B    bool   `json:"e2b"`
		}
		if err := decode(r, &b); err != nil {
			return err
		}
		var opts []api.TokenOption
		if b.E2B {
			opts = append(opts, api.WithTokenPrefix(api.TokenPrefixE2B))
		}
		return reply(w, 200)(h.svc.CreateToken(r.Context(), c, b.Tenant, opts...))
	})
	handle("DELETE /v1/tokens/{id}", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		return noContent(w, h.svc.RevokeToken(r.Context(), c, r.PathValue("id")))
	})
	handle("GET /v1/nodes", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		return reply(w, 200)(h.svc.NodeInfo(r.Context(), c))
	})
	handle("POST /v1/capacity", func(w http.ResponseWriter, r *http.Request, c api.Caller) error {
		var spec node.SandboxSpec
		if err := decode(r, &spec); err != nil {
			return err
		}
		return reply(w, 200)(h.svc.Capacity(r.Context(), c, spec))
	})
}
