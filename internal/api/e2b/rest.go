package e2b

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/internal/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
)

// defaultTimeout is E2B's default sandbox timeout when a create names none.
const defaultTimeout = 15 * time.Second

// maxBody bounds control-plane request bodies.
const maxBody = 1 << 20

// Wire types of E2B's OpenAPI spec (e2b-dev/infra spec/openapi.yml).

type networkConfig struct {
	AllowOut           []string        `json:"allowOut,omitempty"`
	DenyOut            []string        `json:"denyOut,omitempty"`
	AllowPublicTraffic *bool           `json:"allowPublicTraffic,omitempty"`
	MaskRequestHost    *string         `json:"maskRequestHost,omitempty"`
	EgressProxy        json.RawMessage `json:"egressProxy,omitempty"`
	Rules              json.RawMessage `json:"rules,omitempty"`
	HTTPSPorts         []int           `json:"httpsPorts,omitempty"`
}

type newSandbox struct {
	TemplateID          string                  `json:"templateID"`
	Timeout             *int64                  `json:"timeout"`
	AutoPause           *bool                   `json:"autoPause"`
	AutoPauseMemory     *bool                   `json:"autoPauseMemory"`
	AutoResume          *struct{ Enabled bool } `json:"autoResume"`
	Secure              *bool                   `json:"secure"`
	Metadata            map[string]string       `json:"metadata"`
	EnvVars             map[string]string       `json:"envVars"`
	AllowInternetAccess *bool                   `json:"allow_internet_access"`
	Network             *networkConfig          `json:"network"`
	MCP                 json.RawMessage         `json:"mcp"`
	IAM                 json.RawMessage         `json:"iam"`
	VolumeMounts        json.RawMessage         `json:"volumeMounts"`
}

type sandboxReply struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

type sandboxDetail struct {
	TemplateID          string            `json:"templateID"`
	SandboxID           string            `json:"sandboxID"`
	Alias               string            `json:"alias,omitempty"`
	ClientID            string            `json:"clientID"`
	StartedAt           time.Time         `json:"startedAt"`
	EndAt               time.Time         `json:"endAt"`
	CPUCount            int               `json:"cpuCount"`
	MemoryMB            int64             `json:"memoryMB"`
	DiskSizeMB          int64             `json:"diskSizeMB"`
	EnvdVersion         string            `json:"envdVersion"`
	EnvdAccessToken     string            `json:"envdAccessToken,omitempty"`
	Metadata            map[string]string `json:"metadata"`
	State               string            `json:"state"`
	AllowInternetAccess bool              `json:"allowInternetAccess"`
	Network             *networkConfig    `json:"network,omitempty"`
	Domain              *string           `json:"domain"`
	Lifecycle           *lifecycle        `json:"lifecycle,omitempty"`
}

type lifecycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

type timeoutRequest struct {
	Timeout *int64 `json:"timeout"`
}

type sandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

func (h *Handler) routeREST(m *http.ServeMux) {
	m.HandleFunc("POST /sandboxes", h.authed(h.createSandbox))
	m.HandleFunc("POST /v2/sandboxes", h.authed(h.createSandbox))
	m.HandleFunc("GET /sandboxes", h.authed(h.listV1))
	m.HandleFunc("GET /v2/sandboxes", h.authed(h.listV2))
	m.HandleFunc("GET /sandboxes/{id}", h.authed(h.getSandbox))
	m.HandleFunc("DELETE /sandboxes/{id}", h.authed(h.killSandbox))
	m.HandleFunc("POST /sandboxes/{id}/timeout", h.authed(h.setTimeout))
	m.HandleFunc("POST /sandboxes/{id}/pause", h.authed(h.pauseSandbox))
	m.HandleFunc("POST /sandboxes/{id}/resume", h.authed(h.resumeSandbox))
	m.HandleFunc("POST /sandboxes/{id}/connect", h.authed(h.connectSandbox))
	m.HandleFunc("POST /v2/sandboxes/{id}/connect", h.authed(h.connectSandbox))
	m.HandleFunc("GET /sandboxes/{id}/metrics", h.authed(h.metrics))
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, fmt.Errorf("%s %s is not part of dsec's E2B API: %w", r.Method, r.URL.Path, errdefs.ErrNotFound))
	})
}

func (h *Handler) authed(next func(http.ResponseWriter, *http.Request, api.Caller)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, err := h.restCaller(r)
		if err != nil {
			writeError(w, err)
			return
		}
		next(w, r, c)
	}
}

// decodeBody decodes an optional JSON body; an empty body leaves v alone.
func decodeBody(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return fmt.Errorf("reading the request body: %w", err)
	}
	if len(b) > maxBody {
		return invalid("request body is larger than %d bytes", maxBody)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return invalid("request body is not valid JSON for this call: %v", err)
	}
	return nil
}

// seconds converts an E2B timeout (integer seconds) to a duration.
func seconds(what string, n int64) (time.Duration, error) {
	if n < 0 {
		return 0, invalid("%s must not be negative (got %d)", what, n)
	}
	if n > math.MaxInt64/int64(time.Second) {
		return 0, invalid("%s of %d seconds is too large", what, n)
	}
	return time.Duration(n) * time.Second, nil
}

// specFromNew maps an E2B create request onto a dsec sandbox spec; what
// dsec cannot do is refused, not ignored.
func specFromNew(req *newSandbox) (node.SandboxSpec, error) {
	var spec node.SandboxSpec
	if req.TemplateID == "" {
		return spec, invalid("templateID is required (the name of a dsec image)")
	}
	switch {
	case req.AutoPause != nil && *req.AutoPause:
		return spec, fmt.Errorf("autoPause (pause instead of kill at the timeout) is not supported by dsec: %w", errdefs.ErrNotImplemented)
	case req.AutoResume != nil && req.AutoResume.Enabled:
		return spec, fmt.Errorf("autoResume is not supported by dsec: %w", errdefs.ErrNotImplemented)
	case len(req.MCP) > 0 && string(req.MCP) != "null":
		return spec, fmt.Errorf("mcp is not supported by dsec: %w", errdefs.ErrNotImplemented)
	case len(req.VolumeMounts) > 0 && string(req.VolumeMounts) != "null" && string(req.VolumeMounts) != "[]":
		return spec, fmt.Errorf("volumeMounts are not supported by dsec: %w", errdefs.ErrNotImplemented)
	case len(req.IAM) > 0 && string(req.IAM) != "null":
		return spec, fmt.Errorf("iam tokens are not supported by dsec: %w", errdefs.ErrNotImplemented)
	}
	timeout := defaultTimeout
	if req.Timeout != nil && *req.Timeout != 0 {
		d, err := seconds("timeout", *req.Timeout)
		if err != nil {
			return spec, err
		}
		timeout = d
	}
	spec.Image = req.TemplateID
	spec.MaxLifetime = timeout
	spec.Labels = map[string]string{}
	for k, v := range req.Metadata {
		if strings.HasPrefix(k, labelPrefix) {
			return spec, invalid("metadata key %q: the prefix %q is reserved", k, labelPrefix)
		}
		spec.Labels[k] = v
	}
	keys := make([]string, 0, len(req.EnvVars))
	for k := range req.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return spec, invalid("envVars key %q: want a non-empty name without '=' or NUL", k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		spec.Env = append(spec.Env, k+"="+req.EnvVars[k])
	}
	pol, err := networkPolicy(req.AllowInternetAccess, req.Network)
	if err != nil {
		return spec, err
	}
	spec.Network = pol
	return spec, nil
}

func (h *Handler) createSandbox(w http.ResponseWriter, r *http.Request, c api.Caller) {
	var req newSandbox
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	spec, err := specFromNew(&req)
	if err != nil {
		writeError(w, err)
		return
	}
	token := newAccessToken()
	spec.Labels[labelAccessToken] = token
	spec.Labels[labelTemplate] = req.TemplateID
	sb, err := h.svc.CreateSandbox(r.Context(), c, spec)
	if err != nil {
		writeError(w, err)
		return
	}
	h.remember(sb.ID, sandboxAuth{tenant: sb.Spec.Tenant, token: token})
	writeJSON(w, http.StatusCreated, h.reply(sb))
}

func (h *Handler) domainPtr() *string {
	if h.domain == "" {
		return nil
	}
	d := h.domain
	return &d
}

func templateOf(sb *node.Sandbox) string {
	if t := sb.Spec.Labels[labelTemplate]; t != "" {
		return t
	}
	return sb.Spec.Image
}

func (h *Handler) reply(sb *node.Sandbox) sandboxReply {
	return sandboxReply{
		TemplateID:      templateOf(sb),
		SandboxID:       sb.ID,
		ClientID:        sb.Node,
		EnvdVersion:     EnvdVersion,
		EnvdAccessToken: sb.Spec.Labels[labelAccessToken],
		Domain:          h.domainPtr(),
	}
}

// endAt is when the sandbox's lifetime ends: the latest timeout set through
// this face, else its creation time plus its max lifetime.
func (h *Handler) endAt(sb *node.Sandbox) time.Time {
	h.mu.Lock()
	d, ok := h.deadlines[sb.ID]
	h.mu.Unlock()
	if ok {
		return d
	}
	if sb.Spec.MaxLifetime > 0 {
		return sb.CreatedAt.Add(sb.Spec.MaxLifetime)
	}
	return time.Time{}
}

func metadataOf(sb *node.Sandbox) map[string]string {
	md := map[string]string{}
	for k, v := range sb.Spec.Labels {
		if !strings.HasPrefix(k, labelPrefix) {
			md[k] = v
		}
	}
	return md
}

func (h *Handler) detail(sb *node.Sandbox) sandboxDetail {
	allowOut, denyOut, internet := networkView(sb.Spec.Network)
	d := sandboxDetail{
		TemplateID:          templateOf(sb),
		SandboxID:           sb.ID,
		ClientID:            sb.Node,
		StartedAt:           sb.CreatedAt.UTC(),
		EndAt:               h.endAt(sb).UTC(),
		CPUCount:            int(math.Ceil(sb.Spec.CPU)),
		MemoryMB:            sb.Spec.MemoryBytes >> 20,
		DiskSizeMB:          sb.Spec.DiskBytes >> 20,
		EnvdVersion:         EnvdVersion,
		EnvdAccessToken:     sb.Spec.Labels[labelAccessToken],
		Metadata:            metadataOf(sb),
		State:               sb.State,
		AllowInternetAccess: internet,
		Domain:              h.domainPtr(),
		Lifecycle:           &lifecycle{OnTimeout: "kill"},
	}
	if len(allowOut)+len(denyOut) > 0 {
		d.Network = &networkConfig{AllowOut: allowOut, DenyOut: denyOut}
	}
	return d
}

func (h *Handler) getSandbox(w http.ResponseWriter, r *http.Request, c api.Caller) {
	sb, err := h.svc.GetSandbox(r.Context(), c, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, h.detail(sb))
}

// parseMetadataQuery parses E2B's metadata filter: one query parameter
// holding "k1=v1&k2=v2", in which the SDK has already percent-encoded each
// key and value (encodeURIComponent), so they are unescaped once more.
func parseMetadataQuery(q string) (map[string]string, error) {
	if q == "" {
		return nil, nil
	}
	vals, err := url.ParseQuery(q)
	if err != nil {
		return nil, invalid("metadata filter %q: %v", q, err)
	}
	out := map[string]string{}
	for k, v := range vals {
		if len(v) != 1 {
			return nil, invalid("metadata filter: key %q given %d times", k, len(v))
		}
		uk, err1 := url.PathUnescape(k)
		uv, err2 := url.PathUnescape(v[0])
		if err1 != nil || err2 != nil {
			return nil, invalid("metadata filter: %q=%q is not percent-encoded properly", k, v[0])
		}
		out[uk] = uv
	}
	return out, nil
}

// visible lists the caller's sandboxes in E2B's states, oldest first.
func (h *Handler) visible(r *http.Request, c api.Caller, states map[string]bool) ([]node.Sandbox, error) {
	md, err := parseMetadataQuery(r.URL.Query().Get("metadata"))
	if err != nil {
		return nil, err
	}
	all, err := h.svc.ListSandboxes(r.Context(), c, api.ListFilter{Labels: md})
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, sb := range all {
		if states[sb.State] {
			out = append(out, sb)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

func (h *Handler) listV1(w http.ResponseWriter, r *http.Request, c api.Caller) {
	sbs, err := h.visible(r, c, map[string]bool{node.StateRunning: true, node.StatePaused: true})
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]sandboxDetail, 0, len(sbs))
	for i := range sbs {
		out = append(out, h.listed(&sbs[i]))
	}
	writeJSON(w, http.StatusOK, out)
}

// listed is a ListedSandbox: the detail without secrets.
func (h *Handler) listed(sb *node.Sandbox) sandboxDetail {
	d := h.detail(sb)
	d.EnvdAccessToken, d.Network, d.Lifecycle = "", nil, nil
	return d
}

func (h *Handler) listV2(w http.ResponseWriter, r *http.Request, c api.Caller) {
	q := r.URL.Query()
	states := map[string]bool{}
	for _, s := range strings.Split(q.Get("state"), ",") {
		switch s = strings.TrimSpace(s); s {
		case "":
		case node.StateRunning, node.StatePaused:
			states[s] = true
		default:
			writeError(w, invalid("state %q: want running or paused", s))
			return
		}
	}
	if len(states) == 0 {
		states = map[string]bool{node.StateRunning: true, node.StatePaused: true}
	}
	limit := 100
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			writeError(w, invalid("limit %q: want 1-1000", l))
			return
		}
		limit = n
	}
	after := ""
	if t := q.Get("nextToken"); t != "" {
		b, err := base64.RawURLEncoding.DecodeString(t)
		if err != nil {
			writeError(w, invalid("nextToken %q is not one this server issued", t))
			return
		}
		after = string(b)
	}
	sbs, err := h.visible(r, c, states)
	if err != nil {
		writeError(w, err)
		return
	}
	// The cursor is the position (creation time and id) of the last item
	// of the previous page, so deletions in between do not skip items.
	start := 0
	if after != "" {
		start = len(sbs)
		for i := range sbs {
			if cursor(&sbs[i]) > after {
				start = i
				break
			}
		}
	}
	end := min(start+limit, len(sbs))
	out := make([]sandboxDetail, 0, end-start)
	for i := start; i < end; i++ {
		out = append(out, h.listed(&sbs[i]))
	}
	if end < len(sbs) {
		w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString([]byte(cursor(&sbs[end-1]))))
	}
	writeJSON(w, http.StatusOK, out)
}

// cursor orders like visible's sort: zero-padded nanoseconds, then the id.
func cursor(sb *node.Sandbox) string {
	return fmt.Sprintf("%020d/%s", sb.CreatedAt.UnixNano(), sb.ID)
}

func (h *Handler) killSandbox(w http.ResponseWriter, r *http.Request, c api.Caller) {
	id := r.PathValue("id")
	if err := h.svc.DeleteSandbox(r.Context(), c, id); err != nil {
		writeError(w, err)
		return
	}
	h.forget(id)
	h.procs.dropSandbox(id)
	w.WriteHeader(http.StatusNoContent)
}

// applyTimeout sets the sandbox's lifetime to end d from now.
func (h *Handler) applyTimeout(r *http.Request, c api.Caller, id string, d time.Duration) error {
	if err := h.svc.SetTimeout(r.Context(), c, id, d); err != nil {
		return err
	}
	h.mu.Lock()
	evictOne(h.deadlines)
	h.deadlines[id] = time.Now().Add(d)
	h.mu.Unlock()
	return nil
}

func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request, c api.Caller) {
	var req timeoutRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Timeout == nil {
		writeError(w, invalid("timeout (seconds) is required"))
		return
	}
	d, err := seconds("timeout", *req.Timeout)
	if err == nil && d == 0 {
		err = invalid("timeout must be at least 1 second")
	}
	if err != nil {
		writeError(w, err)
		return
	}
	if err := h.applyTimeout(r, c, r.PathValue("id"), d); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *Handler) pauseSandbox(w http.ResponseWriter, r *http.Request, c api.Caller) {
	if err := h.svc.PauseSandbox(r.Context(), c, r.PathValue("id")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// resumeSandbox is E2B's (deprecated) resume: 409 if it is not paused.
func (h *Handler) resumeSandbox(w http.ResponseWriter, r *http.Request, c api.Caller) {
	var req struct {
		Timeout   *int64 `json:"timeout"`
		AutoPause *bool  `json:"autoPause"`
	}
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.AutoPause != nil && *req.AutoPause {
		writeError(w, fmt.Errorf("autoPause is not supported by dsec: %w", errdefs.ErrNotImplemented))
		return
	}
	id := r.PathValue("id")
	if err := h.svc.ResumeSandbox(r.Context(), c, id); err != nil {
		writeError(w, err)
		return
	}
	if req.Timeout != nil && *req.Timeout > 0 {
		d, err := seconds("timeout", *req.Timeout)
		if err == nil {
			err = h.applyTimeout(r, c, id, d)
		}
		if err != nil {
			writeError(w, err)
			return
		}
	}
	sb, err := h.svc.GetSandbox(r.Context(), c, id)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, h.reply(sb))
}

// connectSandbox returns a sandbox to connect to, resuming it if paused.
// The timeout only extends the lifetime, never shortens it (E2B's rule).
func (h *Handler) connectSandbox(w http.ResponseWriter, r *http.Request, c api.Caller) {
	var req timeoutRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	var timeout time.Duration
	if req.Timeout != nil {
		d, err := seconds("timeout", *req.Timeout)
		if err != nil {
			writeError(w, err)
			return
		}
		timeout = d
	}
	id := r.PathValue("id")
	sb, err := h.svc.GetSandbox(r.Context(), c, id)
	if err != nil {
		writeError(w, err)
		return
	}
	status := http.StatusOK
	switch sb.State {
	case node.StateRunning:
	case node.StatePaused:
		if err := h.svc.ResumeSandbox(r.Context(), c, id); err != nil && !errdefs.IsFailedPrecondition(err) {
			writeError(w, err)
			return
		}
		status = http.StatusCreated
	default:
		writeError(w, fmt.Errorf("sandbox %s is %s: %w", id, sb.State, errdefs.ErrNotFound))
		return
	}
	if timeout > 0 {
		if end := h.endAt(sb); end.IsZero() || time.Now().Add(timeout).After(end) {
			if err := h.applyTimeout(r, c, id, timeout); err != nil {
				writeError(w, err)
				return
			}
		}
	}
	writeJSON(w, status, h.reply(sb))
}

func (h *Handler) metrics(w http.ResponseWriter, r *http.Request, c api.Caller) {
	id := r.PathValue("id")
	sb, err := h.svc.GetSandbox(r.Context(), c, id)
	if err != nil {
		writeError(w, err)
		return
	}
	st, err := h.svc.SandboxStats(r.Context(), c, id)
	if err != nil {
		writeError(w, err)
		return
	}
	now := time.Now().UTC()
	cpus := int(math.Ceil(sb.Spec.CPU))
	pct := 0.0
	if cpus > 0 {
		pct = 100 * st.CPUUsed / float64(cpus)
	}
	writeJSON(w, http.StatusOK, []sandboxMetric{{
		Timestamp: now, TimestampUnix: now.Unix(), CPUCount: cpus, CPUUsedPct: pct,
		MemUsed: st.MemoryHeldBytes, MemTotal: st.MemoryLimitBytes, MemCache: st.MemoryFileBytes,
		DiskUsed: st.DiskUsedBytes, DiskTotal: sb.Spec.DiskBytes,
	}})
}
