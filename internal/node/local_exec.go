package node

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/runtime"
)

func (l *Local) execDir(sandboxID string) string {
	return filepath.Join(l.metaDir(), sandboxID+".execs")
}

// running returns the sandbox if it can run processes or serve files now.
func (l *Local) running(id string) (*sandbox, error) {
	sb, err := l.get(id)
	if err != nil {
		return nil, err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	l.checkAlive(sb)
	if sb.rec.State != StateRunning {
		return nil, fmt.Errorf("sandbox %s is %s: %w", id, sb.rec.State, errdefs.ErrFailedPrecondition)
	}
	sb.rec.LastActivity = time.Now()
	return sb, nil
}

// StartExec implements Agent.
func (l *Local) StartExec(ctx context.Context, req ExecRequest, pio runtime.IO) (*ExecInfo, error) {
	if len(req.Args) == 0 && req.Shell == "" {
		return nil, fmt.Errorf("exec: a command is required: %w", errdefs.ErrInvalidArgument)
	}
	if req.Timeout < 0 || req.OutputCap < 0 {
		return nil, fmt.Errorf("exec: timeout and output cap must not be negative: %w", errdefs.ErrInvalidArgument)
	}
	sb, err := l.running(req.SandboxID)
	if err != nil {
		return nil, err
	}
	args := req.Args
	if req.Shell != "" {
		args = []string{"/bin/sh", "-c", req.Shell}
	}
	info := ExecInfo{SandboxID: req.SandboxID, Request: req, Running: true, StartedAt: time.Now()}
	// The record that lets a restarted server find the exec is kept by the
	// runtime with its result, so an exec creates no file of the node's.
	record, err := json.Marshal(&info)
	if err != nil {
		return nil, err
	}
	e, err := l.deps.Runtime.Start(ctx, req.SandboxID, runtime.Process{
		Args: args, Env: req.Env, Cwd: req.Cwd, User: req.User,
		Timeout: req.Timeout, OutputCap: req.OutputCap, Record: record,
	}, pio)
	if err != nil {
		return nil, err
	}
	info.ExecID, info.Pid = e.ID(), e.Pid()
	ent := &execEntry{info: info, exec: e, done: make(chan struct{})}
	sb.mu.Lock()
	sb.execs[e.ID()] = ent
	sb.mu.Unlock()
	go func() {
		res, err := e.Wait(context.Background())
		sb.mu.Lock()
		ent.info.Running = false
		if err != nil && res == nil {
			res = &runtime.ExecResult{ExecID: e.ID(), ExitCode: -1, Signal: "lost: " + err.Error()}
		}
		ent.info.Result = res
		sb.rec.LastActivity = time.Now()
		sb.mu.Unlock()
		// The record given at start stays as it is: loadExec completes it
		// from the runtime's result.
		close(ent.done)
		l.retire(sb, req.SandboxID, e.ID(), res.OutputBytes)
	}()
	return &info, nil // a copy: ent.info changes when the exec ends
}

// loadExec reads an exec that is not in memory (ended, or started by an
// earlier server process) from its record and result.
func (l *Local) loadExec(sandboxID, execID string) (*ExecInfo, error) {
	if !validID(execID) {
		return nil, fmt.Errorf("exec %q: %w", execID, errdefs.ErrNotFound)
	}
	st, err := l.deps.Runtime.ExecState(sandboxID, execID)
	var b []byte
	if err == nil {
		b = st.Record
	}
	if len(b) == 0 {
		// Servers before 2026-11-30 kept a file per exec of their own.
		legacy, lerr := os.ReadFile(filepath.Join(l.execDir(sandboxID), execID+".json"))
		if lerr != nil {
			if err != nil && !errdefs.IsNotFound(err) && !errdefs.IsInvalidArgument(err) {
				return nil, err
			}
			return nil, fmt.Errorf("exec %s: %w", execID, errdefs.ErrNotFound)
		}
		b = legacy
	}
	var info ExecInfo
	if err := json.Unmarshal(b, &info); err != nil {
		return nil, fmt.Errorf("exec %s: unreadable record: %w", execID, err)
	}
	info.ExecID, info.SandboxID = execID, sandboxID
	switch {
	case err != nil || st.Lost:
		info.Running = false
		info.Result = &runtime.ExecResult{ExecID: execID, ExitCode: -1, Signal: "lost"}
	case st.Result != nil:
		info.Running, info.Result, info.Pid = false, st.Result, st.Result.Pid
	default:
		info.Running = true
		if st.Pid > 0 {
			info.Pid = st.Pid
		}
	}
	return &info, nil
}

// execIDs lists the execs a sandbox keeps on disk.
func (l *Local) execIDs(sandboxID string) ([]string, error) {
	ids, err := l.deps.Runtime.ListExecs(sandboxID)
	if err != nil && !errdefs.IsNotFound(err) {
		return nil, err
	}
	legacy, lerr := os.ReadDir(l.execDir(sandboxID))
	if lerr != nil {
		return ids, nil
	}
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		seen[id] = true
	}
	for _, e := range legacy {
		if id, ok := strings.CutSuffix(e.Name(), ".json"); ok && !seen[id] {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// WaitExec implements Agent.
func (l *Local) WaitExec(ctx context.Context, sandboxID, execID string) (*runtime.ExecResult, error) {
	sb, err := l.get(sandboxID)
	if err != nil {
		return nil, err
	}
	sb.mu.Lock()
	ent := sb.execs[execID]
	sb.mu.Unlock()
	if ent == nil {
		// An exec of an earlier server: poll its recorded result.
		for {
			info, err := l.loadExec(sandboxID, execID)
			if err != nil {
				return nil, err
			}
			if !info.Running {
				return info.Result, nil
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	select {
	case <-ent.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return ent.info.Result, nil
}

// GetExec implements Agent.
func (l *Local) GetExec(ctx context.Context, sandboxID, execID string) (*ExecInfo, error) {
	sb, err := l.get(sandboxID)
	if err != nil {
		return nil, err
	}
	sb.mu.Lock()
	ent := sb.execs[execID]
	var info ExecInfo
	if ent != nil {
		info = ent.info
	}
	sb.mu.Unlock()
	if ent == nil {
		return l.loadExec(sandboxID, execID)
	}
	return &info, nil
}

// ListExecs implements Agent.
func (l *Local) ListExecs(ctx context.Context, sandboxID string) ([]ExecInfo, error) {
	if _, err := l.get(sandboxID); err != nil {
		return nil, err
	}
	ids, err := l.execIDs(sandboxID)
	if err != nil {
		return nil, err
	}
	out := []ExecInfo{}
	for _, id := range ids {
		if info, err := l.GetExec(ctx, sandboxID, id); err == nil {
			out = append(out, *info)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].StartedAt.Before(out[j].StartedAt) })
	return out, nil
}

// ExecOutput implements Agent.
func (l *Local) ExecOutput(ctx context.Context, sandboxID, execID, stream string) (io.ReadCloser, int64, error) {
	if _, err := l.get(sandboxID); err != nil {
		return nil, 0, err
	}
	if !validID(execID) {
		return nil, 0, fmt.Errorf("exec %q: %w", execID, errdefs.ErrNotFound)
	}
	rc, n, err := l.deps.Runtime.OpenExecOutput(sandboxID, execID, stream)
	if errdefs.IsNotFound(err) {
		return nil, 0, fmt.Errorf("output of exec %s in sandbox %s is not kept (unknown, forgotten under the sandbox's exec retention, or the sandbox is dead): %w",
			execID, sandboxID, errdefs.ErrNotFound)
	}
	return rc, n, err
}

// SignalExec implements Agent.
func (l *Local) SignalExec(ctx context.Context, sandboxID, execID string, signal int) error {
	if signal <= 0 || signal > 64 {
		return fmt.Errorf("signal %d: %w", signal, errdefs.ErrInvalidArgument)
	}
	sb, err := l.get(sandboxID)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	ent := sb.execs[execID]
	sb.mu.Unlock()
	if ent == nil {
		info, err := l.loadExec(sandboxID, execID)
		if err != nil {
			return err
		}
		if !info.Running {
			return fmt.Errorf("exec %s has ended: %w", execID, errdefs.ErrFailedPrecondition)
		}
		return fmt.Errorf("exec %s was started by an earlier server process and can only be waited for: %w", execID, errdefs.ErrFailedPrecondition)
	}
	select {
	case <-ent.done:
		return fmt.Errorf("exec %s has ended: %w", execID, errdefs.ErrFailedPrecondition)
	default:
	}
	return ent.exec.Signal(syscall.Signal(signal))
}

// withRoot runs fn on the sandbox's root file system.
func (l *Local) withRoot(id string, fn func(FileRoot) error) error {
	sb, err := l.get(id)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	l.checkAlive(sb)
	state := sb.rec.State
	sb.rec.LastActivity = time.Now()
	sb.mu.Unlock()
	if state != StateRunning && state != StatePaused {
		return fmt.Errorf("sandbox %s is %s: %w", id, state, errdefs.ErrFailedPrecondition)
	}
	dir, err := l.deps.Runtime.RootFS(id)
	if err != nil {
		return err
	}
	root, err := l.deps.Files(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	return fn(root)
}

// ReadFile implements Agent. The returned reader keeps the root open until closed.
func (l *Local) ReadFile(ctx context.Context, sandboxID, path string) (io.ReadCloser, *FileInfo, error) {
	var rc io.ReadCloser
	var fi *FileInfo
	err := l.withRoot(sandboxID, func(r FileRoot) error {
		var err error
		rc, fi, err = r.Open(path)
		return err
	})
	return rc, fi, err
}

// WriteFile implements Agent.
func (l *Local) WriteFile(ctx context.Context, sandboxID, path string, mode os.FileMode, r io.Reader) (*FileInfo, error) {
	var fi *FileInfo
	err := l.withRoot(sandboxID, func(root FileRoot) error {
		var err error
		fi, err = root.WriteFile(path, mode, r)
		return err
	})
	return fi, err
}

// StatFile implements Agent.
func (l *Local) StatFile(ctx context.Context, sandboxID, path string) (*FileInfo, error) {
	var fi *FileInfo
	err := l.withRoot(sandboxID, func(root FileRoot) error {
		var err error
		fi, err = root.Stat(path)
		return err
	})
	return fi, err
}

// ListDir implements Agent.
func (l *Local) ListDir(ctx context.Context, sandboxID, path string, depth int) ([]FileInfo, error) {
	if depth <= 0 {
		depth = 1
	}
	var out []FileInfo
	err := l.withRoot(sandboxID, func(root FileRoot) error {
		var err error
		out, err = root.ListDir(path, depth)
		return err
	})
	return out, err
}

// MakeDir implements Agent.
func (l *Local) MakeDir(ctx context.Context, sandboxID, path string, mode os.FileMode) error {
	if mode == 0 {
		mode = 0o755
	}
	return l.withRoot(sandboxID, func(root FileRoot) error { return root.MkdirAll(path, mode) })
}

// Remove implements Agent.
func (l *Local) Remove(ctx context.Context, sandboxID, path string, recursive bool) error {
	return l.withRoot(sandboxID, func(root FileRoot) error { return root.Remove(path, recursive) })
}

// Rename implements Agent.
func (l *Local) Rename(ctx context.Context, sandboxID, from, to string) error {
	return l.withRoot(sandboxID, func(root FileRoot) error { return root.Rename(from, to) })
}
