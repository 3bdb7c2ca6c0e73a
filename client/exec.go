package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"

	"github.com/dsec-dev/dsec/internal/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// execFrame is one NDJSON frame of an exec reply; exactly one group of
// fields is set per frame.
type execFrame struct {
	ExecID string      `json:"exec_id,omitempty"`
	Pid    int         `json:"pid,omitempty"`
	Stream string      `json:"stream,omitempty"`
	Data   []byte      `json:"data,omitempty"`
	Result *ExecResult `json:"result,omitempty"`
	Error  string      `json:"error,omitempty"`
	Code   string      `json:"code,omitempty"`
}

// ExecSession is a started exec whose output is still streaming. Read it to
// the end with Wait; Close abandons the stream (the process keeps running
// on the server and can be found with ListExecs / WaitExec).
type ExecSession struct {
	// ExecID and Pid identify the process on the server (for SignalExec).
	ExecID string
	Pid    int

	sandboxID string
	c         *Client
	resp      *http.Response
	dec       *json.Decoder
	stdin     *stdinReader
	once      sync.Once
}

// stdinReader stops feeding the request body once the exec has finished, so
// the transport does not keep reading a caller's stdin for a dead process.
type stdinReader struct {
	mu   sync.Mutex
	r    io.Reader
	done bool
}

func (s *stdinReader) Read(p []byte) (int, error) {
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	if done || s.r == nil {
		return 0, io.EOF
	}
	return s.r.Read(p)
}

func (s *stdinReader) stop() {
	s.mu.Lock()
	s.done = true
	s.mu.Unlock()
}

// StartExec starts req in sandbox req.SandboxID and returns once the server
// has started the process. stdin (may be nil) is streamed to the process
// until EOF, while output streams back; the caller must call Wait or Close.
func (c *Client) StartExec(ctx context.Context, req ExecRequest, stdin io.Reader) (*ExecSession, error) {
	if err := need("sandbox id", req.SandboxID); err != nil {
		return nil, err
	}
	if len(req.Args) == 0 && req.Shell == "" {
		return nil, fmt.Errorf("exec needs a command (args or shell): %w", errdefs.ErrInvalidArgument)
	}
	line, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("client: encode exec request: %w", err)
	}
	line = append(line, '\n')
	sr := &stdinReader{r: stdin}
	var body io.Reader = bytes.NewReader(line)
	if stdin != nil {
		body = io.MultiReader(bytes.NewReader(line), sr)
	}
	hreq, err := c.newRequest(ctx, http.MethodPost, sandboxPath(req.SandboxID, "/exec"), nil, body)
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/x-ndjson")
	hreq.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.send(hreq)
	if err != nil {
		sr.stop()
		return nil, err
	}
	s := &ExecSession{sandboxID: req.SandboxID, c: c, resp: resp, dec: json.NewDecoder(resp.Body), stdin: sr}
	var f execFrame
	if err := s.dec.Decode(&f); err != nil {
		s.Close()
		return nil, fmt.Errorf("exec in %s: no start frame: %w", req.SandboxID, streamErr(err))
	}
	if f.Error != "" || f.Code != "" {
		s.Close()
		return nil, frameError(f.Error, f.Code)
	}
	if f.ExecID == "" {
		s.Close()
		return nil, fmt.Errorf("exec in %s: first frame carries no exec id: %w", req.SandboxID, errdefs.ErrUnavailable)
	}
	s.ExecID, s.Pid = f.ExecID, f.Pid
	return s, nil
}

// streamErr classifies a broken stream: the server or connection went away.
func streamErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("stream ended early: %w", errdefs.ErrUnavailable)
	}
	return err
}

// Wait copies the process output to stdout and stderr (nil discards) as it
// arrives and returns the result. A process that exits non-zero is not an
// error: look at ExitCode, Signal and TimedOut.
func (s *ExecSession) Wait(stdout, stderr io.Writer) (*ExecResult, error) {
	defer s.Close()
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	for {
		var f execFrame
		if err := s.dec.Decode(&f); err != nil {
			return nil, fmt.Errorf("exec %s in %s: %w (the process may still run; see WaitExec)", s.ExecID, s.sandboxID, streamErr(err))
		}
		switch {
		case f.Result != nil:
			return f.Result, nil
		case f.Error != "" || f.Code != "":
			return nil, frameError(f.Error, f.Code)
		case f.Stream == "stdout":
			if _, err := stdout.Write(f.Data); err != nil {
				return nil, fmt.Errorf("exec %s: write stdout: %w", s.ExecID, err)
			}
		case f.Stream == "stderr":
			if _, err := stderr.Write(f.Data); err != nil {
				return nil, fmt.Errorf("exec %s: write stderr: %w", s.ExecID, err)
			}
		}
		// Unknown frames are skipped so newer servers can add kinds.
	}
}

// Signal sends a signal to the running process (e.g. 2 on Ctrl-C).
func (s *ExecSession) Signal(ctx context.Context, signal int) error {
	return s.c.SignalExec(ctx, s.sandboxID, s.ExecID, signal)
}

// Close abandons the output stream and stops sending stdin.
func (s *ExecSession) Close() error {
	s.once.Do(func() {
		s.stdin.stop()
		_ = s.resp.Body.Close()
	})
	return nil
}

// Exec runs req to completion, streaming stdin in and output out. It returns
// the process result; a non-zero exit is not an error.
func (c *Client) Exec(ctx context.Context, req ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (*ExecResult, error) {
	s, err := c.StartExec(ctx, req, stdin)
	if err != nil {
		return nil, err
	}
	return s.Wait(stdout, stderr)
}

// ListExecs lists the execs a sandbox knows about.
func (c *Client) ListExecs(ctx context.Context, sandboxID string) ([]ExecInfo, error) {
	if err := need("sandbox id", sandboxID); err != nil {
		return nil, err
	}
	var out []ExecInfo
	if err := c.call(ctx, http.MethodGet, sandboxPath(sandboxID, "/execs"), nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// GetExec describes one exec.
func (c *Client) GetExec(ctx context.Context, sandboxID, execID string) (*ExecInfo, error) {
	if err := need("exec id", execID); err != nil {
		return nil, err
	}
	if err := need("sandbox id", sandboxID); err != nil {
		return nil, err
	}
	var out ExecInfo
	if err := c.call(ctx, http.MethodGet, sandboxPath(sandboxID, "/execs/", esc(execID)), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// WaitExec blocks until an exec has ended and returns its result.
func (c *Client) WaitExec(ctx context.Context, sandboxID, execID string) (*ExecResult, error) {
	if err := need("exec id", execID); err != nil {
		return nil, err
	}
	if err := need("sandbox id", sandboxID); err != nil {
		return nil, err
	}
	var out ExecResult
	if err := c.call(ctx, http.MethodGet, sandboxPath(sandboxID, "/execs/", esc(execID), "/wait"), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SignalExec sends a signal (e.g. 15, 9) to an exec.
func (c *Client) SignalExec(ctx context.Context, sandboxID, execID string, signal int) error {
	if err := need("exec id", execID); err != nil {
		return err
	}
	if err := need("sandbox id", sandboxID); err != nil {
		return err
	}
	if signal <= 0 || signal > 64 {
		return fmt.Errorf("signal %d out of range 1..64: %w", signal, errdefs.ErrInvalidArgument)
	}
	return c.call(ctx, http.MethodPost, sandboxPath(sandboxID, "/execs/", esc(execID), "/signal"), nil,
		api.SignalRequest{Signal: signal}, nil)
}

// Streams of an exec's kept output (ExecOutput).
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

// ExecOutput reads what the server kept of one stream (Stdout or Stderr)
// of an exec: the tail of at most its output cap, also after the client
// that started it went away. The server forgets the oldest ended execs of
// a sandbox beyond its exec history, and all of them when the sandbox
// dies or is deleted. The caller closes the reader.
func (c *Client) ExecOutput(ctx context.Context, sandboxID, execID, stream string) (io.ReadCloser, error) {
	if err := need("exec id", execID); err != nil {
		return nil, err
	}
	if err := need("sandbox id", sandboxID); err != nil {
		return nil, err
	}
	if stream != Stdout && stream != Stderr {
		return nil, fmt.Errorf("stream %q: want %q or %q: %w", stream, Stdout, Stderr, errdefs.ErrInvalidArgument)
	}
	resp, err := c.download(ctx, sandboxPath(sandboxID, "/execs/", esc(execID), "/output"), url.Values{"stream": {stream}})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}
