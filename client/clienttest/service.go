package clienttest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/internal/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/runtime"
	"github.com/dsec-dev/dsec/internal/testutil"
	"golang.org/x/sys/unix"
)

// Synthetic node figures.
const (
	NodeCPUs         = 8
	NodeMemoryBytes  = 16 << 30
	NodeMemAvailable = 12 << 30
	MemPerSandbox    = 3 << 20
)

type sandbox struct {
	sb    node.Sandbox
	root  string
	execs map[string]*execState
}

type execState struct {
	info node.ExecInfo
	cmd  *exec.Cmd
	done chan struct{}
	res  *runtime.ExecResult
	// kept is the output kept per stream ("stdout", "stderr").
	kept map[string]*testutil.SyncBuffer
}

// Service is an in-memory api.Service for tests.
type Service struct {
	dir string

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	images    map[string]*api.ImageInfo
	tenants   map[string]*api.Tenant
	tokens    map[string]*api.Token // by secret
	// CreateDelay, when set, is slept in CreateSandbox (to make bench
	// latencies non-zero and ordering observable).
	CreateDelay time.Duration
}

var _ api.Service = (*Service)(nil)

// NewService returns a Service keeping sandbox roots under dir. The admin
// tenant (api.AdminTenant) exists from the start.
func NewService(dir string) *Service {
	return &Service{
		dir:       dir,
		sandboxes: map[string]*sandbox{},
		images:    map[string]*api.ImageInfo{},
		tenants:   map[string]*api.Tenant{api.AdminTenant: {Name: api.AdminTenant, Admin: true, CreatedAt: time.Now()}},
		tokens:    map[string]*api.Token{},
	}
}

// AddImage registers an image (owner root, public) without an import.
func (s *Service) AddImage(ref string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ref = normRef(ref)
	s.images[ref] = &api.ImageInfo{Name: ref, Digest: "sha256:" + newID(32), Owner: api.AdminTenant, Public: true, CreatedAt: time.Now()}
}

// Live returns the number of sandboxes not deleted.
func (s *Service) Live() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sandboxes)
}

func newID(n int) string {
	b := make([]byte, n/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func normRef(ref string) string {
	if i := strings.LastIndexByte(ref, ':'); i < 0 || strings.Contains(ref[i:], "/") {
		return ref + ":latest"
	}
	return ref
}

func (s *Service) get(c api.Caller, id string) (*sandbox, error) {
	sb, ok := s.sandboxes[id]
	if !ok || (!c.Admin && sb.sb.Spec.Tenant != c.Tenant) {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

// CreateSandbox implements api.Service.
func (s *Service) CreateSandbox(ctx context.Context, c api.Caller, spec node.SandboxSpec) (*node.Sandbox, error) {
	if spec.Image == "" && spec.FromSandbox == "" {
		return nil, fmt.Errorf("image is required: %w", errdefs.ErrInvalidArgument)
	}
	if spec.CPU < 0 || spec.MemoryBytes < 0 || spec.DiskBytes < 0 {
		return nil, fmt.Errorf("negative resources: %w", errdefs.ErrInvalidArgument)
	}
	if s.CreateDelay > 0 {
		select {
		case <-time.After(s.CreateDelay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if spec.Image != "" {
		img, ok := s.images[normRef(spec.Image)]
		if !ok || (!img.Public && img.Owner != c.Tenant && !c.Admin) {
			return nil, fmt.Errorf("image %s: %w", spec.Image, errdefs.ErrNotFound)
		}
	}
	if t, ok := s.tenants[c.Tenant]; ok && t.Quota.Sandboxes > 0 {
		n := 0
		for _, sb := range s.sandboxes {
			if sb.sb.Spec.Tenant == c.Tenant {
				n++
			}
		}
		if n >= t.Quota.Sandboxes {
			return nil, fmt.Errorf("tenant %s holds %d sandboxes, quota %d: %w", c.Tenant, n, t.Quota.Sandboxes, errdefs.ErrResourceExhausted)
		}
	}
	spec.ID = "sb-" + newID(12)
	spec.Tenant = c.Tenant
	root := filepath.Join(s.dir, spec.ID)
	if err := os.MkdirAll(filepath.Join(root, "tmp"), 0o755); err != nil {
		return nil, err
	}
	if spec.FromSandbox != "" {
		src, err := s.get(c, spec.FromSandbox)
		if err != nil {
			return nil, err
		}
		if err := os.CopyFS(root, os.DirFS(src.root)); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
		if spec.Image == "" {
			spec.Image = src.sb.Spec.Image
		}
	}
	now := time.Now()
	sb := &sandbox{root: root, execs: map[string]*execState{}, sb: node.Sandbox{
		Spec: spec, ID: spec.ID, Node: "fake-node", State: node.StateRunning, CreatedAt: now, LastActivity: now,
	}}
	s.sandboxes[spec.ID] = sb
	out := sb.sb
	return &out, nil
}

// GetSandbox implements api.Service.
func (s *Service) GetSandbox(ctx context.Context, c api.Caller, id string) (*node.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, err := s.get(c, id)
	if err != nil {
		return nil, err
	}
	out := sb.sb
	return &out, nil
}

// ListSandboxes implements api.Service.
func (s *Service) ListSandboxes(ctx context.Context, c api.Caller, f api.ListFilter) ([]node.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []node.Sandbox{}
next:
	for _, sb := range s.sandboxes {
		if !c.Admin && sb.sb.Spec.Tenant != c.Tenant {
			continue
		}
		if f.State != "" && sb.sb.State != f.State {
			continue
		}
		for k, v := range f.Labels {
			if sb.sb.Spec.Labels[k] != v {
				continue next
			}
		}
		out = append(out, sb.sb)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

// DeleteSandbox implements api.Service.
func (s *Service) DeleteSandbox(ctx context.Context, c api.Caller, id string) error {
	s.mu.Lock()
	sb, err := s.get(c, id)
	if err == nil {
		delete(s.sandboxes, id)
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	for _, e := range sb.execs {
		if e.cmd != nil && e.cmd.Process != nil {
			_ = e.cmd.Process.Kill()
		}
	}
	return os.RemoveAll(sb.root)
}

func (s *Service) setState(c api.Caller, id, from, to string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, err := s.get(c, id)
	if err != nil {
		return err
	}
	if sb.sb.State != from {
		return fmt.Errorf("sandbox %s is %s, not %s: %w", id, sb.sb.State, from, errdefs.ErrFailedPrecondition)
	}
	sb.sb.State = to
	return nil
}

// PauseSandbox implements api.Service.
func (s *Service) PauseSandbox(ctx context.Context, c api.Caller, id string) error {
	return s.setState(c, id, node.StateRunning, node.StatePaused)
}

// ResumeSandbox implements api.Service.
func (s *Service) ResumeSandbox(ctx context.Context, c api.Caller, id string) error {
	return s.setState(c, id, node.StatePaused, node.StateRunning)
}

// SetTimeout implements api.Service.
func (s *Service) SetTimeout(ctx context.Context, c api.Caller, id string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("timeout must be positive: %w", errdefs.ErrInvalidArgument)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, err := s.get(c, id)
	if err != nil {
		return err
	}
	sb.sb.Spec.MaxLifetime = time.Since(sb.sb.CreatedAt) + d
	return nil
}

// SandboxStats implements api.Service.
func (s *Service) SandboxStats(ctx context.Context, c api.Caller, id string) (*node.SandboxStats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, err := s.get(c, id)
	if err != nil {
		return nil, err
	}
	return &node.SandboxStats{
		ID: id, State: sb.sb.State, CPURequested: sb.sb.Spec.CPU,
		MemoryLimitBytes: sb.sb.Spec.MemoryBytes, MemoryHeldBytes: MemPerSandbox,
		PidsCurrent: int64(len(sb.execs)) + 1,
	}, nil
}

// SetNetwork implements api.Service.
func (s *Service) SetNetwork(ctx context.Context, c api.Caller, id string, p node.NetworkPolicy) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, err := s.get(c, id)
	if err != nil {
		return err
	}
	sb.sb.Spec.Network = p
	return nil
}

// Snapshot implements api.Service.
func (s *Service) Snapshot(ctx context.Context, c api.Caller, id, ref string) (*api.ImageInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.get(c, id); err != nil {
		return nil, err
	}
	ref = normRef(ref)
	img := &api.ImageInfo{Name: ref, Digest: "sha256:" + newID(32), Owner: c.Tenant, CreatedAt: time.Now()}
	s.images[ref] = img
	out := *img
	return &out, nil
}

// Fork implements api.Service.
func (s *Service) Fork(ctx context.Context, c api.Caller, id string, count int) ([]node.Sandbox, error) {
	if count < 1 {
		return nil, fmt.Errorf("count must be at least 1: %w", errdefs.ErrInvalidArgument)
	}
	s.mu.Lock()
	src, err := s.get(c, id)
	var spec node.SandboxSpec
	if err == nil {
		spec = src.sb.Spec
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	spec.FromSandbox = id
	var out []node.Sandbox
	for range count {
		sb, err := s.CreateSandbox(ctx, c, spec)
		if err != nil {
			return out, err
		}
		out = append(out, *sb)
	}
	return out, nil
}

// StartExec implements api.Service: a host process in the sandbox's root.
func (s *Service) StartExec(ctx context.Context, c api.Caller, req node.ExecRequest, pio runtime.IO) (*node.ExecInfo, error) {
	s.mu.Lock()
	sb, err := s.get(c, req.SandboxID)
	if err == nil && sb.sb.State != node.StateRunning {
		err = fmt.Errorf("sandbox %s is %s: %w", req.SandboxID, sb.sb.State, errdefs.ErrFailedPrecondition)
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	args := req.Args
	if req.Shell != "" {
		args = []string{"/bin/sh", "-c", req.Shell}
	}
	if len(args) == 0 {
		return nil, fmt.Errorf("no command: %w", errdefs.ErrInvalidArgument)
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		return nil, fmt.Errorf("%s: executable not found: %w", args[0], errdefs.ErrInvalidArgument)
	}
	cmd := exec.Command(path, args[1:]...)
	cmd.Dir = filepath.Join(sb.root, filepath.Clean("/"+req.Cwd))
	cmd.Env = append(append([]string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + sb.root}, sb.sb.Spec.Env...), req.Env...)
	kept := map[string]*testutil.SyncBuffer{runtime.StdoutLog: {}, runtime.StderrLog: {}}
	cmd.Stdin = pio.Stdin
	cmd.Stdout, cmd.Stderr = kept[runtime.StdoutLog].Tee(pio.Stdout), kept[runtime.StderrLog].Tee(pio.Stderr)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", args[0], errdefs.ErrInvalidArgument)
	}
	e := &execState{cmd: cmd, done: make(chan struct{}), kept: kept, info: node.ExecInfo{
		ExecID: "ex-" + newID(8), SandboxID: req.SandboxID, Pid: cmd.Process.Pid, Request: req, Running: true, StartedAt: time.Now(),
	}}
	s.mu.Lock()
	sb.execs[e.info.ExecID] = e
	sb.sb.LastActivity = time.Now()
	s.mu.Unlock()
	go s.reap(e, req.Timeout)
	out := e.info
	return &out, nil
}

func (s *Service) reap(e *execState, timeout time.Duration) {
	var timedOut bool
	if timeout > 0 {
		t := time.AfterFunc(timeout, func() {
			s.mu.Lock()
			timedOut = true
			s.mu.Unlock()
			_ = e.cmd.Process.Kill()
		})
		defer t.Stop()
	}
	_ = e.cmd.Wait()
	st := e.cmd.ProcessState
	res := &runtime.ExecResult{ExecID: e.info.ExecID, Pid: e.info.Pid, ExitCode: st.ExitCode(), Duration: time.Since(e.info.StartedAt)}
	for _, b := range e.kept {
		res.OutputBytes += int64(len(b.Bytes()))
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		res.Signal = unix.SignalName(ws.Signal())
		res.ExitCode = 128 + int(ws.Signal())
	}
	s.mu.Lock()
	res.TimedOut = timedOut
	e.res = res
	e.info.Running = false
	e.info.Result = res
	s.mu.Unlock()
	close(e.done)
}

func (s *Service) getExec(c api.Caller, sid, eid string) (*execState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, err := s.get(c, sid)
	if err != nil {
		return nil, err
	}
	e, ok := sb.execs[eid]
	if !ok {
		return nil, fmt.Errorf("exec %s: %w", eid, errdefs.ErrNotFound)
	}
	return e, nil
}

// WaitExec implements api.Service.
func (s *Service) WaitExec(ctx context.Context, c api.Caller, sid, eid string) (*runtime.ExecResult, error) {
	e, err := s.getExec(c, sid, eid)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := *e.res
	return &out, nil
}

// GetExec implements api.Service.
func (s *Service) GetExec(ctx context.Context, c api.Caller, sid, eid string) (*node.ExecInfo, error) {
	e, err := s.getExec(c, sid, eid)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := e.info
	return &out, nil
}

// ListExecs implements api.Service.
func (s *Service) ListExecs(ctx context.Context, c api.Caller, sid string) ([]node.ExecInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, err := s.get(c, sid)
	if err != nil {
		return nil, err
	}
	out := []node.ExecInfo{}
	for _, e := range sb.execs {
		out = append(out, e.info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].StartedAt.Before(out[j].StartedAt) })
	return out, nil
}

// ExecOutput implements api.Service.
func (s *Service) ExecOutput(ctx context.Context, c api.Caller, sid, eid, stream string) (io.ReadCloser, int64, error) {
	e, err := s.getExec(c, sid, eid)
	if err != nil {
		return nil, 0, err
	}
	b, ok := e.kept[stream]
	if !ok {
		return nil, 0, fmt.Errorf("stream %q: want stdout or stderr: %w", stream, errdefs.ErrInvalidArgument)
	}
	out := b.Bytes()
	return io.NopCloser(bytes.NewReader(out)), int64(len(out)), nil
}

// SignalExec implements api.Service.
func (s *Service) SignalExec(ctx context.Context, c api.Caller, sid, eid string, sig int) error {
	e, err := s.getExec(c, sid, eid)
	if err != nil {
		return err
	}
	if sig < 1 || sig > 64 {
		return fmt.Errorf("bad signal %d: %w", sig, errdefs.ErrInvalidArgument)
	}
	select {
	case <-e.done:
		return fmt.Errorf("exec %s has ended: %w", eid, errdefs.ErrFailedPrecondition)
	default:
	}
	return e.cmd.Process.Signal(syscall.Signal(sig))
}

// hostPath maps an absolute sandbox path into the sandbox's root.
func (s *Service) hostPath(c api.Caller, sid, p string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, err := s.get(c, sid)
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("path %q is not absolute: %w", p, errdefs.ErrInvalidArgument)
	}
	return filepath.Join(sb.root, filepath.Clean(p)), nil
}

func fsErr(err error) error {
	// ENOTEMPTY also matches fs.ErrExist, so it is tested first.
	switch {
	case errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%v: %w", err, errdefs.ErrFailedPrecondition)
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%v: %w", err, errdefs.ErrNotFound)
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("%v: %w", err, errdefs.ErrAlreadyExists)
	}
	return err
}

func (s *Service) info(c api.Caller, sid, p string) (*node.FileInfo, error) {
	hp, err := s.hostPath(c, sid, p)
	if err != nil {
		return nil, err
	}
	st, err := os.Lstat(hp)
	if err != nil {
		return nil, fsErr(err)
	}
	return fileInfo(p, st), nil
}

func fileInfo(p string, st os.FileInfo) *node.FileInfo {
	fi := &node.FileInfo{Name: st.Name(), Path: p, Size: st.Size(), Mode: st.Mode(), ModTime: st.ModTime(), IsDir: st.IsDir()}
	if p == "/" {
		fi.Name = "/"
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		fi.UID, fi.GID = int(sys.Uid), int(sys.Gid)
	}
	return fi
}

// ReadFile implements api.Service.
func (s *Service) ReadFile(ctx context.Context, c api.Caller, sid, p string) (io.ReadCloser, *node.FileInfo, error) {
	fi, err := s.info(c, sid, p)
	if err != nil {
		return nil, nil, err
	}
	if fi.IsDir {
		return nil, nil, fmt.Errorf("%s is a directory: %w", p, errdefs.ErrInvalidArgument)
	}
	hp, _ := s.hostPath(c, sid, p)
	f, err := os.Open(hp)
	if err != nil {
		return nil, nil, fsErr(err)
	}
	return f, fi, nil
}

// WriteFile implements api.Service.
func (s *Service) WriteFile(ctx context.Context, c api.Caller, sid, p string, mode os.FileMode, r io.Reader) (*node.FileInfo, error) {
	hp, err := s.hostPath(c, sid, p)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(hp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return nil, fsErr(err)
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	if err := os.Chmod(hp, mode); err != nil {
		return nil, err
	}
	return s.info(c, sid, p)
}

// StatFile implements api.Service.
func (s *Service) StatFile(ctx context.Context, c api.Caller, sid, p string) (*node.FileInfo, error) {
	return s.info(c, sid, p)
}

// ListDir implements api.Service.
func (s *Service) ListDir(ctx context.Context, c api.Caller, sid, p string, depth int) ([]node.FileInfo, error) {
	if depth < 1 {
		return nil, fmt.Errorf("depth must be at least 1: %w", errdefs.ErrInvalidArgument)
	}
	hp, err := s.hostPath(c, sid, p)
	if err != nil {
		return nil, err
	}
	out := []node.FileInfo{}
	var walk func(dir, vdir string, d int) error
	walk = func(dir, vdir string, d int) error {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return fsErr(err)
		}
		for _, e := range ents {
			st, err := e.Info()
			if err != nil {
				continue
			}
			vp := filepath.Join(vdir, e.Name())
			out = append(out, *fileInfo(vp, st))
			if e.IsDir() && d > 1 {
				if err := walk(filepath.Join(dir, e.Name()), vp, d-1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(hp, filepath.Clean(p), depth); err != nil {
		return nil, err
	}
	return out, nil
}

// MakeDir implements api.Service.
func (s *Service) MakeDir(ctx context.Context, c api.Caller, sid, p string, mode os.FileMode) error {
	hp, err := s.hostPath(c, sid, p)
	if err != nil {
		return err
	}
	return fsErr(os.MkdirAll(hp, mode))
}

// Remove implements api.Service.
func (s *Service) Remove(ctx context.Context, c api.Caller, sid, p string, recursive bool) error {
	hp, err := s.hostPath(c, sid, p)
	if err != nil {
		return err
	}
	if filepath.Clean(p) == "/" {
		return fmt.Errorf("refusing to remove /: %w", errdefs.ErrInvalidArgument)
	}
	if _, err := os.Lstat(hp); err != nil {
		return fsErr(err)
	}
	if recursive {
		return os.RemoveAll(hp)
	}
	return fsErr(os.Remove(hp))
}

// Rename implements api.Service.
func (s *Service) Rename(ctx context.Context, c api.Caller, sid, from, to string) error {
	hf, err := s.hostPath(c, sid, from)
	if err != nil {
		return err
	}
	ht, err := s.hostPath(c, sid, to)
	if err != nil {
		return err
	}
	return fsErr(os.Rename(hf, ht))
}
