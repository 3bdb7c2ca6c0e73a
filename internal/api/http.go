package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// HandlerOption configures NewHandler.
type HandlerOption func(*handlerConfig)

type handlerConfig struct {
	reg         *prometheus.Registry
	log         *slog.Logger
	maxJSON     int64
	maxUpload   int64
	openMetrics bool
}

// WithMetricsRegistry serves /metrics from reg and registers the API
// request counters there. By default a Service with a Registry method
// (ControlPlane) provides it.
func WithMetricsRegistry(reg *prometheus.Registry) HandlerOption {
	return func(c *handlerConfig) { c.reg = reg }
}

// WithHandlerLogger sets the handler's logger.
func WithHandlerLogger(l *slog.Logger) HandlerOption { return func(c *handlerConfig) { c.log = l } }

// WithMaxJSONBytes caps JSON request bodies (default 1 MiB).
func WithMaxJSONBytes(n int64) HandlerOption { return func(c *handlerConfig) { c.maxJSON = n } }

// WithMaxUploadBytes caps one file upload or image tar (default 0: no cap
// here; the sandbox's disk limit applies).
func WithMaxUploadBytes(n int64) HandlerOption { return func(c *handlerConfig) { c.maxUpload = n } }

// WithOpenMetrics serves /metrics without authentication. By default it
// needs an admin caller, since it names tenants and their usage.
func WithOpenMetrics() HandlerOption { return func(c *handlerConfig) { c.openMetrics = true } }

type unixAdminKey struct{}

// ConnContext marks requests arriving on a unix socket, whose callers are
// the admin (the socket is mode 0600, root only). Use it as
// http.Server.ConnContext; Server does.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if _, ok := c.(*net.UnixConn); ok {
		return context.WithValue(ctx, unixAdminKey{}, true)
	}
	return ctx
}

func isUnixAdmin(ctx context.Context) bool {
	v, _ := ctx.Value(unixAdminKey{}).(bool)
	return v
}

type handler struct {
	svc      Service
	cfg      handlerConfig
	mux      *http.ServeMux
	requests *prometheus.CounterVec
}

type routeFunc func(w http.ResponseWriter, r *http.Request, c Caller) error

// NewHandler returns the native HTTP/JSON API (see docs/api.md) over svc.
func NewHandler(svc Service, opts ...HandlerOption) http.Handler {
	h := &handler{svc: svc, cfg: handlerConfig{maxJSON: 1 << 20}, mux: http.NewServeMux()}
	for _, o := range opts {
		o(&h.cfg)
	}
	if h.cfg.log == nil {
		h.cfg.log = slog.New(slog.DiscardHandler)
	}
	if h.cfg.reg == nil {
		// A Service that keeps metrics (ControlPlane) serves them by default.
		if rs, ok := svc.(interface{ Registry() *prometheus.Registry }); ok {
			h.cfg.reg = rs.Registry()
		} else {
			h.cfg.reg = prometheus.NewRegistry()
		}
	}
	h.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dsec_api_requests_total", Help: "API requests by route and status code.",
	}, []string{"route", "code"})
	if err := h.cfg.reg.Register(h.requests); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			h.requests = are.ExistingCollector.(*prometheus.CounterVec)
		}
	}
	routes := map[string]routeFunc{
		"POST /v1/sandboxes":                         h.createSandbox,
		"GET /v1/sandboxes":                          h.listSandboxes,
		"GET /v1/sandboxes/{id}":                     h.getSandbox,
		"DELETE /v1/sandboxes/{id}":                  h.deleteSandbox,
		"POST /v1/sandboxes/{id}/pause":              h.pauseSandbox,
		"POST /v1/sandboxes/{id}/resume":             h.resumeSandbox,
		"POST /v1/sandboxes/{id}/timeout":            h.setTimeout,
		"GET /v1/sandboxes/{id}/stats":               h.sandboxStats,
		"PUT /v1/sandboxes/{id}/network":             h.setNetwork,
		"POST /v1/sandboxes/{id}/snapshot":           h.snapshot,
		"POST /v1/sandboxes/{id}/fork":               h.fork,
		"POST /v1/sandboxes/{id}/exec":               h.exec,
		"GET /v1/sandboxes/{id}/execs":               h.listExecs,
		"GET /v1/sandboxes/{id}/execs/{eid}":         h.getExec,
		"GET /v1/sandboxes/{id}/execs/{eid}/wait":    h.waitExec,
		"GET /v1/sandboxes/{id}/execs/{eid}/output":  h.execOutput,
		"POST /v1/sandboxes/{id}/execs/{eid}/signal": h.signalExec,
		"GET /v1/sandboxes/{id}/files":               h.readFile,
		"PUT /v1/sandboxes/{id}/files":               h.writeFile,
		"DELETE /v1/sandboxes/{id}/files":            h.removeFile,
		"GET /v1/sandboxes/{id}/files/stat":          h.statFile,
		"GET /v1/sandboxes/{id}/files/list":          h.listDir,
		"POST /v1/sandboxes/{id}/files/mkdir":        h.makeDir,
		"POST /v1/sandboxes/{id}/files/rename":       h.rename,
		"POST /v1/images/import":                     h.importImage,
		"POST /v1/images/pull":                       h.pullImage,
		"GET /v1/images":                             h.listImages,
		"GET /v1/images/{ref}":                       h.getImage,
		"DELETE /v1/images/{ref}":                    h.removeImage,
		"POST /v1/images/gc":                         h.gcImages,
		"GET /v1/images/{ref}/stats":                 h.imageStats,
		"POST /v1/tenants":                           h.createTenant,
		"GET /v1/tenants":                            h.listTenants,
		"DELETE /v1/tenants/{name}":                  h.deleteTenant,
		"POST /v1/tokens":                            h.createToken,
		"DELETE /v1/tokens/{id}":                     h.revokeToken,
		"GET /v1/nodes":                              h.nodes,
		"POST /v1/capacity":                          h.capacity,
	}
	for pattern, fn := range routes {
		h.mux.Handle(pattern, h.authed(fn))
	}
	metrics := promhttp.HandlerFor(h.cfg.reg, promhttp.HandlerOpts{})
	h.mux.Handle("GET /metrics", h.authed(func(w http.ResponseWriter, r *http.Request, c Caller) error {
		if !c.Admin && !h.cfg.openMetrics {
			return fmt.Errorf("metrics need an admin caller: %w", errdefs.ErrPermissionDenied)
		}
		metrics.ServeHTTP(w, r)
		return nil
	}))
	h.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"ok"}`+"\n")
	})
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, fmt.Errorf("no route for %s %s: %w", r.Method, r.URL.Path, errdefs.ErrNotFound))
	})
	return h
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sw := &statusWriter{ResponseWriter: w}
	h.mux.ServeHTTP(sw, r)
	route := r.Pattern
	if route == "" || route == "/" {
		route = "unmatched"
	}
	if sw.code == 0 {
		sw.code = http.StatusOK
	}
	h.requests.WithLabelValues(route, strconv.Itoa(sw.code)).Inc()
}

// authed resolves the caller and maps a returned error to a JSON reply
// (when nothing was written yet).
func (h *handler) authed(fn routeFunc) http.Handler {
	metricsOpen := h.cfg.openMetrics
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := h.caller(r)
		if err != nil && metricsOpen && r.URL.Path == "/metrics" {
			c, err = Caller{Tenant: "-"}, nil
		}
		if err == nil {
			err = fn(w, r, c)
		}
		if err == nil {
			return
		}
		if sw, ok := w.(*statusWriter); ok && sw.code != 0 {
			h.cfg.log.Debug("error after the reply started", "path", r.URL.Path, "err", err)
			return
		}
		writeError(w, err)
	})
}

func (h *handler) caller(r *http.Request) (Caller, error) {
	authz := r.Header.Get("Authorization")
	if authz == "" {
		if isUnixAdmin(r.Context()) {
			return AdminCaller, nil
		}
		return Caller{}, fmt.Errorf("missing Authorization: Bearer <token>: %w", errdefs.ErrUnauthenticated)
	}
	scheme, tok, ok := strings.Cut(authz, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return Caller{}, fmt.Errorf("the Authorization header must be \"Bearer <token>\": %w", errdefs.ErrUnauthenticated)
	}
	return h.svc.Authenticate(r.Context(), strings.TrimSpace(tok))
}

// statusWriter records the status for metrics and whether the reply has
// started. Unwrap keeps http.ResponseController working through it.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ErrorBody is the JSON body of every error reply.
type ErrorBody struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func writeError(w http.ResponseWriter, err error) {
	status, code := HTTPStatus(err)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Length")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(ErrorBody{Error: oneLine(err.Error()), Code: code})
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

// decodeJSON reads one JSON value, refusing unknown fields, trailing data
// and bodies over the cap, each with a clear message.
func (h *handler) decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	body := http.MaxBytesReader(w, r.Body, h.cfg.maxJSON)
	return decodeStrict(body, v, h.cfg.maxJSON)
}

func decodeStrict(r io.Reader, v any, max int64) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err, max)
	}
	if _, err := dec.Token(); err != io.EOF {
		if err != nil {
			return jsonError(err, max)
		}
		return invalid("unexpected data after the JSON object")
	}
	return nil
}

func jsonError(err error, max int64) error {
	var (
		mbe *http.MaxBytesError
		se  *json.SyntaxError
		ute *json.UnmarshalTypeError
	)
	switch {
	case errors.Is(err, io.EOF):
		return invalid("the request body is empty; want a JSON object")
	case errors.As(err, &mbe):
		return invalid("the request body is larger than %d bytes", max)
	case errors.As(err, &se):
		return invalid("malformed JSON at byte %d: %v", se.Offset, se)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return invalid("malformed JSON: the body ends early")
	case errors.As(err, &ute):
		return invalid("JSON field %q: want %v, got %s", ute.Field, ute.Type, ute.Value)
	}
	return invalid("bad JSON: %v", err)
}

func pathID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	return id, validID("sandbox id", id)
}

func queryPath(r *http.Request, name string) (string, error) {
	p := r.URL.Query().Get(name)
	return p, validPath(name, p)
}

func queryBool(r *http.Request, name string) (bool, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, invalid("query %s=%q: want true or false", name, s)
	}
	return b, nil
}

func queryMode(r *http.Request, def uint32) (uint32, error) {
	s := r.URL.Query().Get("mode")
	if s == "" {
		return def, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, invalid("query mode=%q: want an octal permission like 0644", s)
	}
	return uint32(m), nil
}
