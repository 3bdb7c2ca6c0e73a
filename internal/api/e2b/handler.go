package e2b

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/dsec-dev/dsec/internal/api"
	"github.com/dsec-dev/dsec/internal/api/e2b/proto/filesystem/filesystemconnect"
	"github.com/dsec-dev/dsec/internal/api/e2b/proto/process/processconnect"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
)

// Labels this face keeps on the sandboxes it creates. Callers' metadata may
// not use the prefix.
const (
	labelPrefix      = "e2b.dsec.dev/"
	labelAccessToken = labelPrefix + "envd-access-token"
	labelTemplate    = labelPrefix + "template"
)

// EnvdVersion is the envd version reported to the SDK. It selects the SDK's
// code paths: >= 0.5.7 uploads with octet-stream when asked, >= 0.5.2 has
// CloseStdin, >= 0.4.0 leaves the user to the server. Features of later
// versions (file metadata 0.6.2, watch entries 0.6.3) are not implemented,
// so the SDK refuses them itself instead of failing on the wire.
const EnvdVersion = "0.5.7"

// Header names of the E2B protocols.
const (
	headerAPIKey      = "X-API-KEY"
	headerSandboxID   = "E2b-Sandbox-Id"
	headerAccessToken = "X-Access-Token"
	headerKeepalive   = "Keepalive-Ping-Interval"
)

// Handler serves the E2B REST control plane and the envd data plane of every
// sandbox on one origin.
type Handler struct {
	svc       api.Service
	log       *slog.Logger
	domain    string
	maxUpload int64
	keepalive time.Duration

	rest *http.ServeMux
	envd *http.ServeMux

	// bg bounds the watchers of started processes: they outlive the
	// request that started them, as envd's processes outlive their stream.
	bg     context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	procs procTable

	mu        sync.Mutex
	sandboxes map[string]sandboxAuth // data-plane auth cache (immutable facts)
	deadlines map[string]time.Time   // timeouts set through this face
}

// sandboxAuth is what the data plane needs to know about a sandbox: who
// owns it and its envd access token. Both never change.
type sandboxAuth struct {
	tenant string
	token  string
}

// Option configures NewHandler.
type Option func(*Handler)

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(h *Handler) { h.log = l } }

// WithDomain sets the "domain" reported for sandboxes (default empty: the
// SDK then uses E2B_SANDBOX_URL or its own default).
func WithDomain(d string) Option { return func(h *Handler) { h.domain = d } }

// WithMaxUpload bounds one POST /files body (default 1 GiB).
func WithMaxUpload(n int64) Option { return func(h *Handler) { h.maxUpload = n } }

// WithDefaultKeepalive sets the keepalive interval of process streams when
// the client does not ask for one (default 50s, what the SDK asks).
func WithDefaultKeepalive(d time.Duration) Option { return func(h *Handler) { h.keepalive = d } }

// NewHandler returns the E2B-compatible API over svc. Requests with an
// E2b-Sandbox-Id header go to the envd data plane of that sandbox; all
// others to the REST control plane. Close stops the process watchers.
func NewHandler(svc api.Service, opts ...Option) *Handler {
	h := &Handler{
		svc:       svc,
		log:       slog.New(slog.DiscardHandler),
		maxUpload: 1 << 30,
		keepalive: 50 * time.Second,
		sandboxes: map[string]sandboxAuth{},
		deadlines: map[string]time.Time{},
	}
	for _, o := range opts {
		o(h)
	}
	h.bg, h.cancel = context.WithCancel(context.Background())
	h.procs.init()

	h.rest = http.NewServeMux()
	h.routeREST(h.rest)

	h.envd = http.NewServeMux()
	copts := []connect.HandlerOption{
		connect.WithInterceptors(h.envdAuthInterceptor()),
		// Output events are mostly small: gzip's per-message setup costs
		// more than it saves below a KiB.
		connect.WithCompressMinBytes(1024),
	}
	h.envd.Handle(processconnect.NewProcessHandler(&processService{h: h}, copts...))
	h.envd.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{h: h}, copts...))
	h.envd.HandleFunc("GET /health", h.health)
	h.envd.HandleFunc("GET /files", h.withEnvdAuth(h.downloadFile))
	h.envd.HandleFunc("POST /files", h.withEnvdAuth(h.uploadFile))
	return h
}

// Close stops watching started processes (the processes keep running) and
// closes their stdin pipes.
func (h *Handler) Close() error {
	h.cancel()
	h.procs.closeAll()
	h.wg.Wait()
	return nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(headerSandboxID) != "" {
		h.envd.ServeHTTP(w, r)
		return
	}
	h.rest.ServeHTTP(w, r)
}

// apiError is E2B's error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError maps err's errdefs class to an HTTP status, E2B's error shape.
func writeError(w http.ResponseWriter, err error) {
	status, _ := api.HTTPStatus(err)
	if status == 499 { // client gone: nobody reads this
		status = http.StatusRequestTimeout
	}
	writeJSON(w, status, apiError{Code: status, Message: err.Error()})
}

// connectError turns an errdefs-classed error into a Connect error.
func connectError(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	code := connect.CodeInternal
	switch {
	case errdefs.IsInvalidArgument(err):
		code = connect.CodeInvalidArgument
	case errdefs.IsNotFound(err):
		code = connect.CodeNotFound
	case errdefs.IsAlreadyExists(err):
		code = connect.CodeAlreadyExists
	case errdefs.IsFailedPrecondition(err):
		code = connect.CodeFailedPrecondition
	case errdefs.IsUnauthenticated(err):
		code = connect.CodeUnauthenticated
	case errdefs.IsPermissionDenied(err):
		code = connect.CodePermissionDenied
	case errdefs.IsResourceExhausted(err):
		code = connect.CodeResourceExhausted
	case errdefs.IsUnavailable(err):
		code = connect.CodeUnavailable
	case errdefs.IsNotImplemented(err):
		code = connect.CodeUnimplemented
	case errors.Is(err, errdefs.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		code = connect.CodeDeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	}
	return connect.NewError(code, err)
}

func invalid(format string, a ...any) error {
	return fmt.Errorf(format+": %w", append(a, errdefs.ErrInvalidArgument)...)
}

func unauthenticated(format string, a ...any) error {
	return fmt.Errorf(format+": %w", append(a, errdefs.ErrUnauthenticated)...)
}

// restCaller authenticates a control-plane request: E2B sends the API key
// as X-API-KEY; a bearer token is accepted too (the E2B CLI's form).
func (h *Handler) restCaller(r *http.Request) (api.Caller, error) {
	key := r.Header.Get(headerAPIKey)
	if key == "" {
		if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			key = strings.TrimSpace(b)
		}
	}
	if key == "" {
		return api.Caller{}, unauthenticated("missing API key: send it as the X-API-KEY header (E2B_API_KEY)")
	}
	return h.svc.Authenticate(r.Context(), key)
}

// errGone marks a data-plane request for a sandbox that does not exist (any
// more). E2B's edge answers those with 502, and the SDK maps a Connect
// "unavailable" to SandboxNotFoundError; ids are random, so this reveals
// nothing guessable.
var errGone = errors.New("sandbox not found")

func gone(id string) error {
	return fmt.Errorf("sandbox %s: %w: %w", id, errGone, errdefs.ErrUnavailable)
}

// writeEnvdError is writeError with E2B's 502 for a sandbox that is gone.
func writeEnvdError(w http.ResponseWriter, err error) {
	if errors.Is(err, errGone) {
		writeJSON(w, http.StatusBadGateway, apiError{Code: http.StatusBadGateway, Message: err.Error()})
		return
	}
	writeError(w, err)
}

func newAccessToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand never fails; it panics instead
	return "ea_" + hex.EncodeToString(b)
}

// sandboxFor returns the data-plane facts of a sandbox, from the cache or
// (once per sandbox) from the control plane.
func (h *Handler) sandboxFor(ctx context.Context, id string) (sandboxAuth, error) {
	h.mu.Lock()
	a, ok := h.sandboxes[id]
	h.mu.Unlock()
	if ok {
		return a, nil
	}
	// The lookup is the control plane's own (admin) view: the access
	// token, checked next, is what authorises the request.
	sb, err := h.svc.GetSandbox(ctx, api.AdminCaller, id)
	if err != nil {
		return sandboxAuth{}, err
	}
	a = sandboxAuth{tenant: sb.Spec.Tenant, token: sb.Spec.Labels[labelAccessToken]}
	h.remember(id, a)
	return a, nil
}

// maxCached bounds the per-sandbox maps: sandboxes that end without this
// face noticing (timeouts, the native API) would otherwise stay forever.
// Evicting costs one lookup (auth) or a less precise endAt.
const maxCached = 1 << 16

func (h *Handler) remember(id string, a sandboxAuth) {
	h.mu.Lock()
	evictOne(h.sandboxes)
	h.sandboxes[id] = a
	h.mu.Unlock()
}

// evictOne drops an arbitrary entry of a full map (h.mu held).
func evictOne[V any](m map[string]V) {
	if len(m) < maxCached {
		return
	}
	for k := range m {
		delete(m, k)
		return
	}
}

func (h *Handler) forget(id string) {
	h.mu.Lock()
	delete(h.sandboxes, id)
	delete(h.deadlines, id)
	h.mu.Unlock()
}

// envdCaller authenticates a data-plane request: the sandbox named by the
// E2b-Sandbox-Id header and its envd access token. The caller acts as the
// sandbox's tenant, so the control plane applies its rules as for any call.
func (h *Handler) envdCaller(ctx context.Context, hdr http.Header) (api.Caller, string, error) {
	id := hdr.Get(headerSandboxID)
	if id == "" {
		return api.Caller{}, "", invalid("missing %s header", headerSandboxID)
	}
	a, err := h.sandboxFor(ctx, id)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return api.Caller{}, "", gone(id)
		}
		return api.Caller{}, "", err
	}
	if a.token == "" {
		return api.Caller{}, "", unauthenticated("sandbox %s was not created through the E2B API and has no envd access token", id)
	}
	got := hdr.Get(headerAccessToken)
	if subtle.ConstantTimeCompare([]byte(got), []byte(a.token)) != 1 {
		return api.Caller{}, "", unauthenticated("sandbox %s: invalid access token", id)
	}
	return api.Caller{Tenant: a.tenant, TokenID: "e2b-envd:" + id}, id, nil
}

type envdKey struct{}

type envdIdentity struct {
	caller    api.Caller
	sandboxID string
	user      string
}

// envdFrom returns the identity the auth interceptor put in ctx.
func envdFrom(ctx context.Context) envdIdentity {
	id, _ := ctx.Value(envdKey{}).(envdIdentity)
	return id
}

// basicUser is the user of "Authorization: Basic base64(user:)", which the
// SDK sends to pick the user of a command or file operation.
func basicUser(hdr http.Header) string {
	u, _, ok := (&http.Request{Header: hdr}).BasicAuth()
	if !ok {
		return ""
	}
	return u
}

func (h *Handler) envdAuthInterceptor() connect.Interceptor {
	return &authInterceptor{h: h}
}

// authInterceptor authenticates every envd RPC, unary and streaming.
type authInterceptor struct{ h *Handler }

func (a *authInterceptor) identify(ctx context.Context, hdr http.Header) (context.Context, error) {
	c, id, err := a.h.envdCaller(ctx, hdr)
	if err != nil {
		return ctx, connectError(err)
	}
	return context.WithValue(ctx, envdKey{}, envdIdentity{caller: c, sandboxID: id, user: basicUser(hdr)}), nil
}

func (a *authInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		ctx, err := a.identify(ctx, req.Header())
		if err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (a *authInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (a *authInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, err := a.identify(ctx, conn.RequestHeader())
		if err != nil {
			return err
		}
		return next(ctx, conn)
	}
}

// withEnvdAuth wraps a plain-HTTP envd route (files) with the same check.
func (h *Handler) withEnvdAuth(next func(http.ResponseWriter, *http.Request, envdIdentity)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, id, err := h.envdCaller(r.Context(), r.Header)
		if err != nil {
			writeEnvdError(w, err)
			return
		}
		next(w, r, envdIdentity{caller: c, sandboxID: id, user: basicUser(r.Header)})
	}
}

// health answers envd's /health: 204 while the sandbox runs, 502 (what
// E2B's edge answers for a sandbox that is gone) otherwise. The SDK probes
// it after a dropped connection to tell a dead sandbox from a network blip.
func (h *Handler) health(w http.ResponseWriter, r *http.Request) {
	c, id, err := h.envdCaller(r.Context(), r.Header)
	if err != nil {
		writeEnvdError(w, err)
		return
	}
	sb, err := h.svc.GetSandbox(r.Context(), c, id)
	switch {
	case errdefs.IsNotFound(err):
		h.forget(id)
		writeEnvdError(w, gone(id))
	case err == nil && sb.State != node.StateRunning:
		writeJSON(w, http.StatusBadGateway, apiError{Code: http.StatusBadGateway, Message: fmt.Sprintf("sandbox %s is %s", id, sb.State)})
	case err != nil:
		writeError(w, err)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}
