package api

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/runtime"
)

func (h *handler) createSandbox(w http.ResponseWriter, r *http.Request, c Caller) error {
	var spec node.SandboxSpec
	if err := h.decodeJSON(w, r, &spec); err != nil {
		return err
	}
	sb, err := h.svc.CreateSandbox(r.Context(), c, spec)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, sb)
}

func (h *handler) listSandboxes(w http.ResponseWriter, r *http.Request, c Caller) error {
	q := r.URL.Query()
	f := ListFilter{State: q.Get("state")}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return invalid("label filter %q: want key=value", l)
		}
		if f.Labels == nil {
			f.Labels = map[string]string{}
		}
		f.Labels[k] = v
	}
	sbs, err := h.svc.ListSandboxes(r.Context(), c, f)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sbs)
}

// sandboxCall is the shape of the many routes that take only the id.
func (h *handler) sandboxCall(w http.ResponseWriter, r *http.Request, c Caller,
	fn func(id string) (any, error), status int) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	v, err := fn(id)
	if err != nil {
		return err
	}
	if status == http.StatusNoContent {
		w.WriteHeader(status)
		return nil
	}
	return writeJSON(w, status, v)
}

func noValue(err error) (any, error) { return nil, err }

func (h *handler) getSandbox(w http.ResponseWriter, r *http.Request, c Caller) error {
	return h.sandboxCall(w, r, c, func(id string) (any, error) { return h.svc.GetSandbox(r.Context(), c, id) }, http.StatusOK)
}

func (h *handler) deleteSandbox(w http.ResponseWriter, r *http.Request, c Caller) error {
	return h.sandboxCall(w, r, c, func(id string) (any, error) { return noValue(h.svc.DeleteSandbox(r.Context(), c, id)) }, http.StatusNoContent)
}

func (h *handler) pauseSandbox(w http.ResponseWriter, r *http.Request, c Caller) error {
	return h.sandboxCall(w, r, c, func(id string) (any, error) { return noValue(h.svc.PauseSandbox(r.Context(), c, id)) }, http.StatusNoContent)
}

func (h *handler) resumeSandbox(w http.ResponseWriter, r *http.Request, c Caller) error {
	return h.sandboxCall(w, r, c, func(id string) (any, error) { return noValue(h.svc.ResumeSandbox(r.Context(), c, id)) }, http.StatusNoContent)
}

func (h *handler) sandboxStats(w http.ResponseWriter, r *http.Request, c Caller) error {
	return h.sandboxCall(w, r, c, func(id string) (any, error) { return h.svc.SandboxStats(r.Context(), c, id) }, http.StatusOK)
}

// TimeoutRequest is the body of POST /v1/sandboxes/{id}/timeout.
type TimeoutRequest struct {
	TimeoutSeconds *int64 `json:"timeout_seconds"`
}

func (h *handler) setTimeout(w http.ResponseWriter, r *http.Request, c Caller) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	var req TimeoutRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.TimeoutSeconds == nil {
		return invalid("timeout_seconds is required")
	}
	if *req.TimeoutSeconds <= 0 || *req.TimeoutSeconds > int64(100*365*24*3600) {
		return invalid("timeout_seconds must be a positive number of seconds")
	}
	if err := h.svc.SetTimeout(r.Context(), c, id, time.Duration(*req.TimeoutSeconds)*time.Second); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *handler) setNetwork(w http.ResponseWriter, r *http.Request, c Caller) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	var p node.NetworkPolicy
	if err := h.decodeJSON(w, r, &p); err != nil {
		return err
	}
	if err := h.svc.SetNetwork(r.Context(), c, id, p); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// SnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshot.
type SnapshotRequest struct {
	Image string `json:"image"`
}

func (h *handler) snapshot(w http.ResponseWriter, r *http.Request, c Caller) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	var req SnapshotRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.Image == "" {
		return invalid("image is required")
	}
	info, err := h.svc.Snapshot(r.Context(), c, id, req.Image)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, info)
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	Count int `json:"count"`
}

func (h *handler) fork(w http.ResponseWriter, r *http.Request, c Caller) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	var req ForkRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	sbs, err := h.svc.Fork(r.Context(), c, id, req.Count)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sbs)
}

func execIDs(r *http.Request) (string, string, error) {
	id, err := pathID(r)
	if err != nil {
		return "", "", err
	}
	eid := r.PathValue("eid")
	return id, eid, validExecID(eid)
}

func (h *handler) listExecs(w http.ResponseWriter, r *http.Request, c Caller) error {
	return h.sandboxCall(w, r, c, func(id string) (any, error) { return h.svc.ListExecs(r.Context(), c, id) }, http.StatusOK)
}

func (h *handler) getExec(w http.ResponseWriter, r *http.Request, c Caller) error {
	id, eid, err := execIDs(r)
	if err != nil {
		return err
	}
	info, err := h.svc.GetExec(r.Context(), c, id, eid)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, info)
}

func (h *handler) waitExec(w http.ResponseWriter, r *http.Request, c Caller) error {
	id, eid, err := execIDs(r)
	if err != nil {
		return err
	}
	res, err := h.svc.WaitExec(r.Context(), c, id, eid)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

// execOutput sends the kept tail of one stream of an exec as raw bytes.
func (h *handler) execOutput(w http.ResponseWriter, r *http.Request, c Caller) error {
	id, eid, err := execIDs(r)
	if err != nil {
		return err
	}
	stream := r.URL.Query().Get("stream")
	if stream == "" {
		stream = runtime.StdoutLog
	}
	rc, n, err := h.svc.ExecOutput(r.Context(), c, id, eid, stream)
	if err != nil {
		return err
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	w.WriteHeader(http.StatusOK)
	// Of a running exec the files may grow while they are sent: send what
	// was announced.
	if _, err := io.CopyN(w, rc, n); err != nil {
		h.cfg.log.Debug("exec output cut short", "sandbox", id, "exec", eid, "err", err)
	}
	return nil
}

// SignalRequest is the body of POST .../execs/{eid}/signal.
type SignalRequest struct {
	Signal int `json:"signal"`
}

func (h *handler) signalExec(w http.ResponseWriter, r *http.Request, c Caller) error {
	id, eid, err := execIDs(r)
	if err != nil {
		return err
	}
	var req SignalRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := h.svc.SignalExec(r.Context(), c, id, eid, req.Signal); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *handler) statFile(w http.ResponseWriter, r *http.Request, c Caller) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	p, err := queryPath(r, "path")
	if err != nil {
		return err
	}
	fi, err := h.svc.StatFile(r.Context(), c, id, p)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, fi)
}

func (h *handler) listDir(w http.ResponseWriter, r *http.Request, c Caller) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	p, err := queryPath(r, "path")
	if err != nil {
		return err
	}
	depth := 1
	if s := r.URL.Query().Get("depth"); s != "" {
		if depth, err = strconv.Atoi(s); err != nil || depth < 1 {
			return invalid("query depth=%q: want a positive integer", s)
		}
	}
	fis, err := h.svc.ListDir(r.Context(), c, id, p, depth)
	if err != nil {
		return err
	}
	if fis == nil {
		fis = []node.FileInfo{}
	}
	return writeJSON(w, http.StatusOK, fis)
}

// MkdirRequest is the body of POST .../files/mkdir. Mode is decimal on the
// wire (493 = 0755); 0 means 0755.
type MkdirRequest struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode"`
}

func (h *handler) makeDir(w http.ResponseWriter, r *http.Request, c Caller) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	var req MkdirRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := validPath("path", req.Path); err != nil {
		return err
	}
	if req.Mode > 0o777 {
		return invalid("mode %o: only permission bits (at most 0777) are allowed", req.Mode)
	}
	if err := h.svc.MakeDir(r.Context(), c, id, req.Path, os.FileMode(req.Mode)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *handler) removeFile(w http.ResponseWriter, r *http.Request, c Caller) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	p, err := queryPath(r, "path")
	if err != nil {
		return err
	}
	rec, err := queryBool(r, "recursive")
	if err != nil {
		return err
	}
	if err := h.svc.Remove(r.Context(), c, id, p, rec); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// RenameRequest is the body of POST .../files/rename.
type RenameRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

func (h *handler) rename(w http.ResponseWriter, r *http.Request, c Caller) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	var req RenameRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := validPath("from", req.From); err != nil {
		return err
	}
	if err := validPath("to", req.To); err != nil {
		return err
	}
	if err := h.svc.Rename(r.Context(), c, id, req.From, req.To); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *handler) listImages(w http.ResponseWriter, r *http.Request, c Caller) error {
	ims, err := h.svc.ListImages(r.Context(), c)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, ims)
}

func (h *handler) getImage(w http.ResponseWriter, r *http.Request, c Caller) error {
	info, err := h.svc.GetImage(r.Context(), c, r.PathValue("ref"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, info)
}

func (h *handler) removeImage(w http.ResponseWriter, r *http.Request, c Caller) error {
	if err := h.svc.RemoveImage(r.Context(), c, r.PathValue("ref")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *handler) gcImages(w http.ResponseWriter, r *http.Request, c Caller) error {
	res, err := h.svc.GCImages(r.Context(), c)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

func (h *handler) imageStats(w http.ResponseWriter, r *http.Request, c Caller) error {
	st, err := h.svc.ImageStats(r.Context(), c, r.PathValue("ref"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, st)
}

func (h *handler) createTenant(w http.ResponseWriter, r *http.Request, c Caller) error {
	var t Tenant
	if err := h.decodeJSON(w, r, &t); err != nil {
		return err
	}
	out, err := h.svc.CreateTenant(r.Context(), c, t)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, out)
}

func (h *handler) listTenants(w http.ResponseWriter, r *http.Request, c Caller) error {
	ts, err := h.svc.ListTenants(r.Context(), c)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, ts)
}

func (h *handler) deleteTenant(w http.ResponseWriter, r *http.Request, c Caller) error {
	if err := h.svc.DeleteTenant(r.Context(), c, r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// TokenRequest is the body of POST /v1/tokens. Prefix is "dsec_"
// (default) or "e2b_".
type TokenRequest struct {
	Tenant string `json:"tenant"`
	Prefix string `json:"prefix,omitempty"`
}

func (h *handler) createToken(w http.ResponseWriter, r *http.Request, c Caller) error {
	var req TokenRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	var opts []TokenOption
	if req.Prefix != "" {
		opts = append(opts, WithTokenPrefix(req.Prefix))
	}
	tok, err := h.svc.CreateToken(r.Context(), c, req.Tenant, opts...)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, tok)
}

func (h *handler) revokeToken(w http.ResponseWriter, r *http.Request, c Caller) error {
	if err := h.svc.RevokeToken(r.Context(), c, r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *handler) nodes(w http.ResponseWriter, r *http.Request, c Caller) error {
	ns, err := h.svc.NodeInfo(r.Context(), c)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, ns)
}

func (h *handler) capacity(w http.ResponseWriter, r *http.Request, c Caller) error {
	var shape node.SandboxSpec
	if err := h.decodeJSON(w, r, &shape); err != nil {
		return err
	}
	capy, err := h.svc.Capacity(r.Context(), c, shape)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capy)
}

// unixMode converts octal Unix permission bits to an os.FileMode.
func unixMode(m uint32) os.FileMode {
	fm := os.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		fm |= os.ModeSetuid
	}
	if m&0o2000 != 0 {
		fm |= os.ModeSetgid
	}
	if m&0o1000 != 0 {
		fm |= os.ModeSticky
	}
	return fm
}

// octalMode renders an os.FileMode's Unix permission bits as "0644".
func octalMode(fm os.FileMode) string {
	m := uint32(fm.Perm())
	if fm&os.ModeSetuid != 0 {
		m |= 0o4000
	}
	if fm&os.ModeSetgid != 0 {
		m |= 0o2000
	}
	if fm&os.ModeSticky != 0 {
		m |= 0o1000
	}
	return fmt.Sprintf("%04o", m)
}
