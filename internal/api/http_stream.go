package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/runtime"
)

// ExecFrame is one line of the exec NDJSON stream. The first frame has
// ExecID and Pid; then Stream/Data frames; the last has Result or Error.
type ExecFrame struct {
	ExecID string              `json:"exec_id,omitempty"`
	Pid    int                 `json:"pid,omitempty"`
	Stream string              `json:"stream,omitempty"` // "stdout" or "stderr"
	Data   []byte              `json:"data,omitempty"`   // base64 on the wire
	Result *runtime.ExecResult `json:"result,omitempty"`
	Error  string              `json:"error,omitempty"`
	Code   string              `json:"code,omitempty"`
}

// ImportFrame is one line of the image import NDJSON stream: progress
// frames, then one with Image or Error.
type ImportFrame struct {
	*ImportProgress
	Image *ImageInfo `json:"image,omitempty"`
	Error string     `json:"error,omitempty"`
	Code  string     `json:"code,omitempty"`
}

// frameWriter writes NDJSON frames, flushing each, from any goroutine.
// Frames are held until the header frame is out (ready), and dropped once
// the handler is done (closed): a process may still write after its
// client left, and must not block on it.
type frameWriter struct {
	mu     sync.Mutex
	w      http.ResponseWriter
	rc     *http.ResponseController
	ready  chan struct{}
	closed bool
	failed bool
}

func newFrameWriter(w http.ResponseWriter) *frameWriter {
	return &frameWriter{w: w, rc: http.NewResponseController(w), ready: make(chan struct{})}
}

func (f *frameWriter) start() {
	f.mu.Lock()
	f.w.Header().Set("Content-Type", "application/x-ndjson")
	f.w.Header().Set("X-Content-Type-Options", "nosniff")
	f.w.WriteHeader(http.StatusOK)
	f.mu.Unlock()
}

func (f *frameWriter) frame(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	b = append(b, '\n')
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || f.failed {
		return
	}
	if _, err := f.w.Write(b); err != nil {
		f.failed = true
		return
	}
	if err := f.rc.Flush(); err != nil {
		f.failed = true
	}
}

func (f *frameWriter) close() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
}

type streamWriter struct {
	f    *frameWriter
	name string
}

// maxFrameData bounds one output frame so a huge write becomes several.
const maxFrameData = 64 << 10

func (s streamWriter) Write(p []byte) (int, error) {
	<-s.f.ready
	n := len(p)
	for len(p) > 0 {
		chunk := p
		if len(chunk) > maxFrameData {
			chunk = chunk[:maxFrameData]
		}
		s.f.frame(ExecFrame{Stream: s.name, Data: chunk})
		p = p[len(chunk):]
	}
	return n, nil
}

// readRequestLine reads the first line of an exec body: the JSON request.
func readRequestLine(br *bufio.Reader, max int64) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if int64(len(line)) > max {
			return nil, invalid("the exec request line is longer than %d bytes", max)
		}
		switch err {
		case nil:
			return line, nil
		case bufio.ErrBufferFull:
			continue
		case io.EOF:
			if len(bytes.TrimSpace(line)) == 0 {
				return nil, invalid("the request body is empty; want a JSON exec request line")
			}
			return line, nil
		default:
			return nil, err
		}
	}
}

// exec streams one process: request line in, then stdin (the rest of the
// body) and NDJSON output concurrently (full duplex).
func (h *handler) exec(w http.ResponseWriter, r *http.Request, c Caller) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	br := bufio.NewReaderSize(r.Body, 64<<10)
	line, err := readRequestLine(br, h.cfg.maxJSON)
	if err != nil {
		return err
	}
	var req node.ExecRequest
	if err := decodeStrict(bytes.NewReader(line), &req, h.cfg.maxJSON); err != nil {
		return err
	}
	if req.SandboxID != "" && req.SandboxID != id {
		return invalid("sandbox_id %q in the body differs from %q in the path", req.SandboxID, id)
	}
	req.SandboxID = id

	fw := newFrameWriter(w)
	// stdin goes through a pipe whose pump starts only once the exec
	// runs, so a refused exec never reads the body, and a finished one
	// can stop the pump before the handler returns.
	pr, pw := io.Pipe()
	info, err := h.svc.StartExec(r.Context(), c, req, runtime.IO{
		Stdin: pr, Stdout: streamWriter{fw, "stdout"}, Stderr: streamWriter{fw, "stderr"},
	})
	if err != nil {
		fw.close()
		close(fw.ready)
		pw.Close()
		return err
	}
	// Without full duplex the HTTP/1 server stops reading the body once
	// the reply starts; stdin must keep flowing while output does.
	_ = fw.rc.EnableFullDuplex()
	fw.start()
	fw.frame(ExecFrame{ExecID: info.ExecID, Pid: info.Pid})
	close(fw.ready)
	pumpDone := make(chan struct{})
	go func() {
		defer close(pumpDone)
		_, err := io.Copy(pw, br)
		pw.CloseWithError(err)
		if err != nil {
			// The process stopped taking stdin: still read the body to
			// its end, see finishDuplex.
			_, _ = io.Copy(io.Discard, br)
		}
	}()

	res, err := h.svc.WaitExec(r.Context(), c, id, info.ExecID)
	if err != nil {
		_, code := HTTPStatus(err)
		fw.frame(ExecFrame{Error: oneLine(err.Error()), Code: code})
	} else {
		fw.frame(ExecFrame{Result: res})
	}
	fw.close()
	_ = pr.Close() // unblocks a pump waiting to hand data to a gone process
	finishDuplex(fw, r, pumpDone)
	return nil
}

// stdinGrace is how long a finished full-duplex call waits for its
// client to finish the request body (clients close stdin on the result
// frame) before cutting the connection.
const stdinGrace = 2 * time.Second

// finishDuplex returns once the request body has been read to its end
// (drained is closed by whoever reads it). In full-duplex mode net/http
// must not be left with an unread body: it would read the rest after the
// handler returns, and the bytes after it must never be parsed as a next
// request. A client that holds the body open past the grace period has
// its connection ended, with a proper end of the chunked reply.
func finishDuplex(fw *frameWriter, r *http.Request, drained <-chan struct{}) {
	t := time.NewTimer(stdinGrace)
	defer t.Stop()
	select {
	case <-drained:
		return
	case <-t.C:
	}
	conn, bufrw, err := fw.rc.Hijack()
	if err != nil {
		// HTTP/2 and others: a read deadline ends the stream's body.
		_ = fw.rc.SetReadDeadline(time.Now())
		<-drained
		return
	}
	if r.ProtoAtLeast(1, 1) {
		_, _ = bufrw.WriteString("0\r\n\r\n")
		_ = bufrw.Flush()
	}
	_ = conn.Close()
	<-drained
}

// readFile streams a file out; it is never held whole in memory.
func (h *handler) readFile(w http.ResponseWriter, r *http.Request, c Caller) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	p, err := queryPath(r, "path")
	if err != nil {
		return err
	}
	rc, fi, err := h.svc.ReadFile(r.Context(), c, id, p)
	if err != nil {
		return err
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	w.Header().Set("X-Dsec-Mode", octalMode(fi.Mode))
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		h.cfg.log.Debug("file download cut short", "sandbox", id, "path", p, "err", err)
	}
	return nil
}

// writeFile streams the request body into a file.
func (h *handler) writeFile(w http.ResponseWriter, r *http.Request, c Caller) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	p, err := queryPath(r, "path")
	if err != nil {
		return err
	}
	mode, err := queryMode(r, 0o644)
	if err != nil {
		return err
	}
	var body io.Reader = r.Body
	if h.cfg.maxUpload > 0 {
		body = http.MaxBytesReader(w, r.Body, h.cfg.maxUpload)
	}
	fi, err := h.svc.WriteFile(r.Context(), c, id, p, unixMode(mode), body)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, fi)
}

// importImage streams progress while the tar body (or a server path) is
// imported. The reply starts with the first progress frame, so an early
// refusal still gets a plain HTTP error status.
func (h *handler) importImage(w http.ResponseWriter, r *http.Request, c Caller) error {
	q := r.URL.Query()
	ref, path := q.Get("ref"), q.Get("path")
	if ref == "" {
		return invalid("query ref is required")
	}
	public, err := queryBool(r, "public")
	if err != nil {
		return err
	}
	var body io.Reader
	if path == "" {
		body = r.Body
		if h.cfg.maxUpload > 0 {
			body = http.MaxBytesReader(w, r.Body, h.cfg.maxUpload)
		}
	}
	return h.streamImage(w, r, body, func(progress func(ImportProgress)) (*ImageInfo, error) {
		return h.svc.ImportImage(r.Context(), c, ref, path, body, public, progress)
	})
}

// pullImage streams progress while the server pulls ref from a registry.
// Services without pulling (the Puller role) answer 501.
func (h *handler) pullImage(w http.ResponseWriter, r *http.Request, c Caller) error {
	p, ok := h.svc.(Puller)
	if !ok {
		return fmt.Errorf("this server cannot pull images: %w", errdefs.ErrNotImplemented)
	}
	ref := r.URL.Query().Get("ref")
	if ref == "" {
		return invalid("query ref is required")
	}
	public, err := queryBool(r, "public")
	if err != nil {
		return err
	}
	return h.streamImage(w, r, nil, func(progress func(ImportProgress)) (*ImageInfo, error) {
		return p.PullImage(r.Context(), c, ref, public, progress)
	})
}

// streamImage runs an import (run) and streams its progress frames, then
// the image or the error. body is the uploaded tar, nil when there is none.
func (h *handler) streamImage(w http.ResponseWriter, r *http.Request, body io.Reader, run func(progress func(ImportProgress)) (*ImageInfo, error)) error {
	fw := newFrameWriter(w)
	duplex := false
	var (
		once    sync.Once
		last    time.Time
		lastMu  sync.Mutex
		started = func() {
			once.Do(func() {
				if body != nil {
					// Progress goes out while the tar is still being read.
					_ = fw.rc.EnableFullDuplex()
					duplex = true
				}
				fw.start()
			})
		}
	)
	progress := func(p ImportProgress) {
		lastMu.Lock()
		now := time.Now()
		skip := !p.Done && now.Sub(last) < 100*time.Millisecond
		if !skip {
			last = now
		}
		lastMu.Unlock()
		if skip {
			return
		}
		started()
		fw.frame(ImportFrame{ImportProgress: &p})
	}
	info, err := run(progress)
	wasStarted := true
	once.Do(func() { wasStarted = false })
	defer func() {
		fw.close()
		if duplex {
			drained := make(chan struct{})
			go func() {
				defer close(drained)
				_, _ = io.Copy(io.Discard, body)
			}()
			finishDuplex(fw, r, drained)
		}
	}()
	if err != nil {
		if !wasStarted {
			return err
		}
		_, code := HTTPStatus(err)
		fw.frame(ImportFrame{Error: oneLine(err.Error()), Code: code})
		return nil
	}
	if !wasStarted {
		fw.start()
	}
	fw.frame(ImportFrame{Image: info})
	return nil
}
