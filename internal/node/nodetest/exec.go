package nodetest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/runtime"
	"github.com/dsec-dev/dsec/internal/testutil"
)

type fakeExec struct {
	mu     sync.Mutex
	info   node.ExecInfo
	done   chan struct{}
	sig    chan int
	result *runtime.ExecResult
	// kept is the output kept per stream, as a node keeps it.
	kept map[string]*testutil.SyncBuffer
}

func (e *fakeExec) kill(sig int) {
	select {
	case e.sig <- sig:
	default:
	}
}

func (e *fakeExec) snapshot() node.ExecInfo {
	e.mu.Lock()
	defer e.mu.Unlock()
	info := e.info
	if e.result != nil {
		r := *e.result
		info.Result = &r
		info.Running = false
	}
	return info
}

// StartExec implements node.Agent.
func (f *Fake) StartExec(ctx context.Context, req node.ExecRequest, pio runtime.IO) (*node.ExecInfo, error) {
	f.count("StartExec")
	args := splitArgs(req)
	if len(args) == 0 {
		return nil, fmt.Errorf("exec: no command: %w", errdefs.ErrInvalidArgument)
	}
	f.mu.Lock()
	sb, err := f.live(req.SandboxID)
	if err != nil {
		f.mu.Unlock()
		return nil, err
	}
	f.execSeq++
	id := fmt.Sprintf("e-%d", f.execSeq)
	e := &fakeExec{
		info: node.ExecInfo{ExecID: id, SandboxID: req.SandboxID, Pid: 1000 + f.execSeq, Request: req, Running: true, StartedAt: time.Now()},
		done: make(chan struct{}),
		sig:  make(chan int, 1),
		kept: map[string]*testutil.SyncBuffer{runtime.StdoutLog: {}, runtime.StderrLog: {}},
	}
	sb.execs[id] = e
	f.mu.Unlock()
	go e.run(args, req.Timeout, pio)
	info := e.snapshot()
	return &info, nil
}

func (e *fakeExec) run(args []string, timeout time.Duration, pio runtime.IO) {
	start := time.Now()
	res := runtime.ExecResult{ExecID: e.info.ExecID, Pid: e.info.Pid}
	stdout, stderr := e.kept[runtime.StdoutLog].Tee(pio.Stdout), e.kept[runtime.StderrLog].Tee(pio.Stderr)
	switch args[0] {
	case "echo":
		_, _ = io.WriteString(stdout, strings.Join(args[1:], " ")+"\n")
	case "err":
		_, _ = io.WriteString(stderr, strings.Join(args[1:], " ")+"\n")
	case "cat":
		if pio.Stdin != nil {
			_, _ = io.Copy(stdout, pio.Stdin)
		}
	case "exit":
		if len(args) > 1 {
			res.ExitCode, _ = strconv.Atoi(args[1])
		}
	case "sleep":
		var tc <-chan time.Time
		if timeout > 0 {
			t := time.NewTimer(timeout)
			defer t.Stop()
			tc = t.C
		}
		select {
		case s := <-e.sig:
			res.ExitCode, res.Signal = 128+s, fmt.Sprintf("signal %d", s)
		case <-tc:
			res.ExitCode, res.Signal, res.TimedOut = 137, "killed", true
		}
	default:
		_, _ = io.WriteString(stderr, args[0]+": command not found\n")
		res.ExitCode = 127
	}
	res.Duration = time.Since(start)
	e.mu.Lock()
	e.result = &res
	e.mu.Unlock()
	close(e.done)
}

func (f *Fake) exec(sandboxID, execID string) (*fakeExec, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.get(sandboxID)
	if err != nil {
		return nil, err
	}
	e := sb.execs[execID]
	if e == nil {
		return nil, fmt.Errorf("exec %s in sandbox %s: %w", execID, sandboxID, errdefs.ErrNotFound)
	}
	return e, nil
}

// WaitExec implements node.Agent.
func (f *Fake) WaitExec(ctx context.Context, sandboxID, execID string) (*runtime.ExecResult, error) {
	f.count("WaitExec")
	e, err := f.exec(sandboxID, execID)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	info := e.snapshot()
	return info.Result, nil
}

// GetExec implements node.Agent.
func (f *Fake) GetExec(ctx context.Context, sandboxID, execID string) (*node.ExecInfo, error) {
	f.count("GetExec")
	e, err := f.exec(sandboxID, execID)
	if err != nil {
		return nil, err
	}
	info := e.snapshot()
	return &info, nil
}

// ListExecs implements node.Agent.
func (f *Fake) ListExecs(ctx context.Context, sandboxID string) ([]node.ExecInfo, error) {
	f.count("ListExecs")
	f.mu.Lock()
	sb, err := f.get(sandboxID)
	var execs []*fakeExec
	if err == nil {
		for _, e := range sb.execs {
			execs = append(execs, e)
		}
	}
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	out := make([]node.ExecInfo, 0, len(execs))
	for _, e := range execs {
		out = append(out, e.snapshot())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].StartedAt.Before(out[j].StartedAt) })
	return out, nil
}

// ExecOutput implements node.Agent.
func (f *Fake) ExecOutput(ctx context.Context, sandboxID, execID, stream string) (io.ReadCloser, int64, error) {
	f.count("ExecOutput")
	if stream != runtime.StdoutLog && stream != runtime.StderrLog {
		return nil, 0, fmt.Errorf("stream %q: want stdout or stderr: %w", stream, errdefs.ErrInvalidArgument)
	}
	e, err := f.exec(sandboxID, execID)
	if err != nil {
		return nil, 0, err
	}
	b := e.kept[stream].Bytes()
	return io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
}

// SignalExec implements node.Agent.
func (f *Fake) SignalExec(ctx context.Context, sandboxID, execID string, signal int) error {
	f.count("SignalExec")
	e, err := f.exec(sandboxID, execID)
	if err != nil {
		return err
	}
	select {
	case <-e.done:
		return fmt.Errorf("exec %s has ended: %w", execID, errdefs.ErrFailedPrecondition)
	default:
	}
	e.kill(signal)
	return nil
}
