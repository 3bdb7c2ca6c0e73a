package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
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
	e, err := l.deps.Runtime.Start(ctx, req.SandboxID, runtime.Process{
		Args: args, Env: req.Env, Cwd: req.Cwd, User: req.User,
		Timeout: req.Timeout, OutputCap: req.OutputCap,
	}, pio)
	if err != nil {
		return nil, err
	}
	ent := &execEntry{
		info: ExecInfo{
			ExecID: e.ID(), SandboxID: req.SandboxID, Pid: e.Pid(), Request: req,
			Running: true, StartedAt: time.Now(),
		},
		exec: e,
		done: make(chan struct{}),
	}
	l.saveExec(&ent.info)
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
		// The record written at start stays as it is: a restarted server
		// completes it from the runtime's result file (loadExec).
		// Rewriting it here cost ~0.2 ms per exec (ext4 flushes a file
		// renamed over another, auto_da_alloc).
		close(ent.done)
		l.retire(sb, req.SandboxID, e.ID(), res.OutputBytes)
	}()
	info := ent.info
	return &info, nil
}

func (l *Local) saveExec(info *ExecInfo) {
	b, _ := json.Marshal(info)
	p := filepath.Join(l.execDir(info.SandboxID), info.ExecID+".json")
	// Written in place, not renamed into place: the name is new, and this
	// is on every exec's path. A record cut short by a crash reads as
	// unreadable (loadExec), which is what it is.
	err := writeNew(p, b)
	if errors.Is(err, fs.ErrNotExist) {
		if err = os.MkdirAll(filepath.Dir(p), 0o700); err == nil {
			err = writeNew(p, b)
		}
	}
	if err != nil {
		l.log.Error("node: save exec", "sandbox", info.SandboxID, "exec", info.ExecID, "err", err)
	}
}

// writeNew creates p, which must not exist, with b.
func writeNew(p string, b []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	return errors.Join(err, f.Close())
}

// loadExec finds an exec of an earlier server process on disk.
func (l *Local) loadExec(sandboxID, execID string) (*ExecInfo, error) {
	if !validID(execID) {
		return nil, fmt.Errorf("exec %q: %w", execID, errdefs.ErrNotFound)
	}
	b, err := os.ReadFile(filepath.Join(l.execDir(sandboxID), execID+".json"))
	if err != nil {
		return nil, fmt.Errorf("exec %s: %w", execID, errdefs.ErrNotFound)
	}
	var info ExecInfo
	if err := json.Unmarshal(b, &info); err != nil {
		return nil, fmt.Errorf("exec %s: unreadable record: %w", execID, err)
	}
	if info.Running {
		res, done, err := l.deps.Runtime.ExecResult(sandboxID, execID)
		// The record stays as written at start: the runtime's result
		// completes it on every read (rewriting it would cost a flush).
		if err == nil && done {
			info.Running = false
			info.Result = res
		} else if err != nil {
			info.Running = false
			info.Result = &runtime.ExecResult{ExecID: execID, ExitCode: -1, Signal: "lost"}
		}
	}
	return &info, nil
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
	ents, err := os.ReadDir(l.execDir(sandboxID))
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	out := []ExecInfo{}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
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
