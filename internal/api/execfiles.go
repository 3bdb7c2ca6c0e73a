package api

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/runtime"
	"github.com/dsec-dev/dsec/internal/store"
)

func execKey(sandboxID, execID string) string { return sandboxID + "/" + execID }

// StartExec implements Service. A watcher records the result in the store
// when the process ends, so it outlives the sandbox's node state.
func (s *ControlPlane) StartExec(ctx context.Context, c Caller, req node.ExecRequest, pio runtime.IO) (_ *node.ExecInfo, err error) {
	defer s.done(c, "StartExec", &req.SandboxID, &err)
	if err := validExec(&req); err != nil {
		return nil, err
	}
	_, a, err := s.loadLive(ctx, c, req.SandboxID)
	if err != nil {
		return nil, err
	}
	s.touch(ctx, req.SandboxID)
	info, err := a.StartExec(ctx, req, pio)
	if err != nil {
		return nil, err
	}
	s.wg.Add(1)
	go s.watchExec(a, *info)
	return info, nil
}

// watchExec waits for an exec to end, then records its result and counts
// the end as activity.
func (s *ControlPlane) watchExec(a node.Agent, info node.ExecInfo) {
	defer s.wg.Done()
	start := time.Now()
	res, err := a.WaitExec(s.bg, info.SandboxID, info.ExecID)
	if err != nil {
		if s.bg.Err() == nil && !errdefs.IsNotFound(err) {
			s.log.Warn("waiting for exec", "sandbox", info.SandboxID, "exec", info.ExecID, "err", err)
		}
		return
	}
	d := time.Since(start)
	if res != nil && res.Duration > 0 {
		d = res.Duration // the node's own measure, start to exit
	}
	s.metrics.execSeconds.Observe(d.Seconds())
	info.Running, info.Result = false, res
	s.recordExec(info)
	s.touch(s.bg, info.SandboxID)
}

// execAgent returns the node of a visible sandbox for exec queries, which
// also work on dead sandboxes (from the store).
func (s *ControlPlane) execAgent(ctx context.Context, c Caller, sandboxID, execID string) (node.Agent, error) {
	if execID != "" {
		if err := validExecID(execID); err != nil {
			return nil, err
		}
	}
	rec, err := s.load(ctx, c, sandboxID)
	if err != nil {
		return nil, err
	}
	a, err := s.nodes.Node(rec.Sandbox.Node)
	if err != nil || rec.Sandbox.State == node.StateDead {
		return nil, nil
	}
	return a, nil
}

func (s *ControlPlane) storedExec(ctx context.Context, sandboxID, execID string) (*node.ExecInfo, error) {
	if info, ok := s.pendingExec(sandboxID, execID); ok {
		return &info, nil
	}
	var info node.ExecInfo
	if err := s.st.Get(ctx, store.BucketExecs, execKey(sandboxID, execID), &info); err != nil {
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("exec %s in sandbox %s: %w", execID, sandboxID, errdefs.ErrNotFound)
		}
		return nil, err
	}
	return &info, nil
}

// WaitExec implements Service.
func (s *ControlPlane) WaitExec(ctx context.Context, c Caller, sandboxID, execID string) (_ *runtime.ExecResult, err error) {
	defer s.done(c, "WaitExec", &sandboxID, &err)
	a, err := s.execAgent(ctx, c, sandboxID, execID)
	if err != nil {
		return nil, err
	}
	if a != nil {
		res, err := a.WaitExec(ctx, sandboxID, execID)
		if err == nil || !errdefs.IsNotFound(err) {
			s.touch(ctx, sandboxID)
			return res, err
		}
	}
	info, err := s.storedExec(ctx, sandboxID, execID)
	if err != nil {
		return nil, err
	}
	if info.Result == nil {
		return nil, fmt.Errorf("exec %s never finished before its sandbox died: %w", execID, errdefs.ErrFailedPrecondition)
	}
	return info.Result, nil
}

// GetExec implements Service.
func (s *ControlPlane) GetExec(ctx context.Context, c Caller, sandboxID, execID string) (_ *node.ExecInfo, err error) {
	defer s.done(c, "GetExec", &sandboxID, &err)
	a, err := s.execAgent(ctx, c, sandboxID, execID)
	if err != nil {
		return nil, err
	}
	if a != nil {
		info, err := a.GetExec(ctx, sandboxID, execID)
		if err == nil || !errdefs.IsNotFound(err) {
			return info, err
		}
	}
	return s.storedExec(ctx, sandboxID, execID)
}

// ListExecs implements Service: the node's execs merged with recorded
// results (the node's view wins).
func (s *ControlPlane) ListExecs(ctx context.Context, c Caller, sandboxID string) (_ []node.ExecInfo, err error) {
	defer s.done(c, "ListExecs", &sandboxID, &err)
	a, err := s.execAgent(ctx, c, sandboxID, "")
	if err != nil {
		return nil, err
	}
	stored, err := store.ListAll[node.ExecInfo](ctx, s.st, store.BucketExecs, sandboxID+"/")
	if err != nil {
		return nil, err
	}
	byID := map[string]node.ExecInfo{}
	for _, e := range stored {
		byID[e.ExecID] = e
	}
	for _, e := range s.pendingExecs(sandboxID) {
		byID[e.ExecID] = e
	}
	if a != nil {
		live, err := a.ListExecs(ctx, sandboxID)
		if err != nil && !errdefs.IsNotFound(err) {
			return nil, err
		}
		for _, e := range live {
			byID[e.ExecID] = e
		}
	}
	out := make([]node.ExecInfo, 0, len(byID))
	for _, e := range byID {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].StartedAt.Equal(out[j].StartedAt) {
			return out[i].StartedAt.Before(out[j].StartedAt)
		}
		return out[i].ExecID < out[j].ExecID
	})
	// The store is pruned in steps (flushExecs): list what the history
	// keeps, and every exec still running.
	ended := 0
	for _, e := range out {
		if !e.Running {
			ended++
		}
	}
	if drop := ended - s.cfg.ExecHistory; drop > 0 {
		kept := out[:0]
		for _, e := range out {
			if !e.Running && drop > 0 {
				drop--
				continue
			}
			kept = append(kept, e)
		}
		out = kept
	}
	return out, nil
}

// ExecOutput implements Service.
func (s *ControlPlane) ExecOutput(ctx context.Context, c Caller, sandboxID, execID, stream string) (_ io.ReadCloser, _ int64, err error) {
	defer s.done(c, "ExecOutput", &sandboxID, &err)
	if stream != runtime.StdoutLog && stream != runtime.StderrLog {
		return nil, 0, invalid("stream %q: want stdout or stderr", stream)
	}
	a, err := s.execAgent(ctx, c, sandboxID, execID)
	if err != nil {
		return nil, 0, err
	}
	if a == nil {
		return nil, 0, fmt.Errorf("sandbox %s is dead: the output of its execs is not kept: %w", sandboxID, errdefs.ErrNotFound)
	}
	return a.ExecOutput(ctx, sandboxID, execID, stream)
}

// SignalExec implements Service.
func (s *ControlPlane) SignalExec(ctx context.Context, c Caller, sandboxID, execID string, signal int) (err error) {
	defer s.done(c, "SignalExec", &sandboxID, &err)
	if signal < 1 || signal > 64 {
		return invalid("signal %d: want 1-64", signal)
	}
	if err := validExecID(execID); err != nil {
		return err
	}
	_, a, err := s.loadLive(ctx, c, sandboxID)
	if err != nil {
		return err
	}
	s.touch(ctx, sandboxID)
	return a.SignalExec(ctx, sandboxID, execID, signal)
}

// fileAgent validates paths and returns the node of a live sandbox, after
// counting the call as activity.
func (s *ControlPlane) fileAgent(ctx context.Context, c Caller, sandboxID string, paths ...string) (node.Agent, error) {
	for _, p := range paths {
		if err := validPath("path", p); err != nil {
			return nil, err
		}
	}
	_, a, err := s.loadLive(ctx, c, sandboxID)
	if err != nil {
		return nil, err
	}
	s.touch(ctx, sandboxID)
	return a, nil
}

// ReadFile implements Service. The reader streams from the node.
func (s *ControlPlane) ReadFile(ctx context.Context, c Caller, sandboxID, path string) (_ io.ReadCloser, _ *node.FileInfo, err error) {
	defer s.done(c, "ReadFile", &sandboxID, &err)
	a, err := s.fileAgent(ctx, c, sandboxID, path)
	if err != nil {
		return nil, nil, err
	}
	return a.ReadFile(ctx, sandboxID, path)
}

// WriteFile implements Service. r is streamed to the node.
func (s *ControlPlane) WriteFile(ctx context.Context, c Caller, sandboxID, path string, mode os.FileMode, r io.Reader) (_ *node.FileInfo, err error) {
	defer s.done(c, "WriteFile", &sandboxID, &err)
	if mode&^(os.ModePerm|os.ModeSetuid|os.ModeSetgid|os.ModeSticky) != 0 {
		return nil, invalid("mode %v: only permission bits are allowed", mode)
	}
	if mode == 0 {
		mode = 0o644
	}
	if r == nil {
		return nil, invalid("no content")
	}
	a, err := s.fileAgent(ctx, c, sandboxID, path)
	if err != nil {
		return nil, err
	}
	return a.WriteFile(ctx, sandboxID, path, mode, r)
}

// StatFile implements Service.
func (s *ControlPlane) StatFile(ctx context.Context, c Caller, sandboxID, path string) (_ *node.FileInfo, err error) {
	defer s.done(c, "StatFile", &sandboxID, &err)
	a, err := s.fileAgent(ctx, c, sandboxID, path)
	if err != nil {
		return nil, err
	}
	return a.StatFile(ctx, sandboxID, path)
}

// maxListDepth bounds ListDir so one call cannot walk a whole tree.
const maxListDepth = 16

// ListDir implements Service. depth 0 means 1.
func (s *ControlPlane) ListDir(ctx context.Context, c Caller, sandboxID, path string, depth int) (_ []node.FileInfo, err error) {
	defer s.done(c, "ListDir", &sandboxID, &err)
	if depth < 0 || depth > maxListDepth {
		return nil, invalid("depth %d: want 1 to %d", depth, maxListDepth)
	}
	if depth == 0 {
		depth = 1
	}
	a, err := s.fileAgent(ctx, c, sandboxID, path)
	if err != nil {
		return nil, err
	}
	return a.ListDir(ctx, sandboxID, path, depth)
}

// MakeDir implements Service (with parents). mode 0 means 0755.
func (s *ControlPlane) MakeDir(ctx context.Context, c Caller, sandboxID, path string, mode os.FileMode) (err error) {
	defer s.done(c, "MakeDir", &sandboxID, &err)
	if mode&^os.ModePerm != 0 {
		return invalid("mode %v: only permission bits are allowed", mode)
	}
	if mode == 0 {
		mode = 0o755
	}
	a, err := s.fileAgent(ctx, c, sandboxID, path)
	if err != nil {
		return err
	}
	return a.MakeDir(ctx, sandboxID, path, mode)
}

// Remove implements Service.
func (s *ControlPlane) Remove(ctx context.Context, c Caller, sandboxID, path string, recursive bool) (err error) {
	defer s.done(c, "Remove", &sandboxID, &err)
	if path == "/" {
		return invalid("refusing to remove /")
	}
	a, err := s.fileAgent(ctx, c, sandboxID, path)
	if err != nil {
		return err
	}
	return a.Remove(ctx, sandboxID, path, recursive)
}

// Rename implements Service.
func (s *ControlPlane) Rename(ctx context.Context, c Caller, sandboxID, from, to string) (err error) {
	defer s.done(c, "Rename", &sandboxID, &err)
	a, err := s.fileAgent(ctx, c, sandboxID, from, to)
	if err != nil {
		return err
	}
	return a.Rename(ctx, sandboxID, from, to)
}
