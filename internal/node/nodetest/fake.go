package nodetest

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/runtime"
)

var _ node.Agent = (*Fake)(nil)

// Fake is an in-memory node.Agent. Its exported hook fields may be set
// before use to inject failures.
type Fake struct {
	name   string
	dir    string
	cpus   int
	memory int64

	// FailCreate, if set, is called by CreateSandbox after admission; a
	// non-nil error fails the create. If CreateLeaks is also set, the
	// sandbox is left registered, as a node that failed half-way would.
	FailCreate  func(spec node.SandboxSpec) error
	CreateLeaks bool
	// CreateDelay makes CreateSandbox slow, to widen race windows.
	CreateDelay time.Duration

	mu      sync.Mutex
	sbs     map[string]*fakeSandbox
	images  map[string]string // snapshot ref -> source sandbox
	execSeq int
	calls   map[string]int
}

type fakeSandbox struct {
	rec     node.Sandbox
	execs   map[string]*fakeExec
	network node.NetworkPolicy
}

// New returns a Fake node named name with cpus cores and memory bytes,
// keeping sandbox files under dir.
func New(name, dir string, cpus int, memory int64) *Fake {
	return &Fake{
		name: name, dir: dir, cpus: cpus, memory: memory,
		sbs: map[string]*fakeSandbox{}, images: map[string]string{}, calls: map[string]int{},
	}
}

func (f *Fake) count(method string) {
	f.mu.Lock()
	f.calls[method]++
	f.mu.Unlock()
}

// Calls returns how often method was called.
func (f *Fake) Calls(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// Has reports whether the node holds sandbox id (in any state).
func (f *Fake) Has(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.sbs[id]
	return ok
}

// Len is the number of sandboxes the node holds.
func (f *Fake) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sbs)
}

// Kill marks a sandbox dead, as if its init had died.
func (f *Fake) Kill(id, reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb := f.sbs[id]; sb != nil {
		sb.rec.State = node.StateDead
		sb.rec.Reason = reason
	}
}

// Forget drops a sandbox without a trace, as a node that lost its state.
func (f *Fake) Forget(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sbs, id)
}

func (f *Fake) get(id string) (*fakeSandbox, error) {
	sb := f.sbs[id]
	if sb == nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

func (f *Fake) live(id string) (*fakeSandbox, error) {
	sb, err := f.get(id)
	if err != nil {
		return nil, err
	}
	if sb.rec.State != node.StateRunning {
		return nil, fmt.Errorf("sandbox %s is %s: %w", id, sb.rec.State, errdefs.ErrFailedPrecondition)
	}
	return sb, nil
}

// used sums the requests of live sandboxes; f.mu held.
func (f *Fake) used() (cpu float64, mem int64) {
	for _, sb := range f.sbs {
		if sb.rec.State == node.StateRunning || sb.rec.State == node.StatePaused {
			cpu += sb.rec.Spec.CPU
			mem += sb.rec.Spec.MemoryBytes
		}
	}
	return cpu, mem
}

// Info implements node.Agent.
func (f *Fake) Info(ctx context.Context) (*node.NodeInfo, error) {
	f.count("Info")
	f.mu.Lock()
	defer f.mu.Unlock()
	cpu, mem := f.used()
	n := 0
	for _, sb := range f.sbs {
		if sb.rec.State != node.StateDead {
			n++
		}
	}
	return &node.NodeInfo{
		Name: f.name, CPUs: f.cpus, MemoryBytes: f.memory, MemAvailable: f.memory - mem,
		Sandboxes: n, CPURequested: cpu, CPUUsed: cpu / 2, MemoryHeldBytes: mem / 2, CgroupVersion: 1,
	}, nil
}

// fits is how many sandboxes of shape still fit and what limits them; f.mu held.
func (f *Fake) fits(shape node.SandboxSpec) (int, string, map[string]int) {
	cpu, mem := f.used()
	detail := map[string]int{}
	best, limiting := int(^uint(0)>>1), ""
	if shape.CPU > 0 {
		detail["cpu"] = int((float64(f.cpus) - cpu + 1e-9) / shape.CPU)
	}
	if shape.MemoryBytes > 0 {
		detail["memory"] = int((f.memory - mem) / shape.MemoryBytes)
	}
	for _, res := range []string{"cpu", "memory"} {
		if n, ok := detail[res]; ok && n < best {
			best, limiting = n, res
		}
	}
	if limiting == "" {
		best = 1000
	}
	if best < 0 {
		best = 0
	}
	return best, limiting, detail
}

// Capacity implements node.Agent.
func (f *Fake) Capacity(ctx context.Context, shape node.SandboxSpec) (*node.Capacity, error) {
	f.count("Capacity")
	f.mu.Lock()
	defer f.mu.Unlock()
	n, lim, d := f.fits(shape)
	return &node.Capacity{Fits: n, LimitingResource: lim, Detail: d}, nil
}

// CreateSandbox implements node.Agent.
func (f *Fake) CreateSandbox(ctx context.Context, spec node.SandboxSpec) (*node.Sandbox, error) {
	f.count("CreateSandbox")
	if f.CreateDelay > 0 {
		select {
		case <-time.After(f.CreateDelay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if spec.ID == "" || (spec.Image == "" && spec.FromSandbox == "") {
		return nil, fmt.Errorf("fake: id and image are required: %w", errdefs.ErrInvalidArgument)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.sbs[spec.ID]; ok {
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, errdefs.ErrAlreadyExists)
	}
	if n, lim, _ := f.fits(spec); n < 1 {
		return nil, fmt.Errorf("node %s: not enough %s: %w", f.name, lim, errdefs.ErrResourceExhausted)
	}
	root := filepath.Join(f.dir, spec.ID)
	if spec.FromSandbox != "" {
		if _, err := f.get(spec.FromSandbox); err != nil {
			return nil, err
		}
		if err := copyTree(filepath.Join(f.dir, spec.FromSandbox), root); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	now := time.Now()
	sb := &fakeSandbox{
		rec: node.Sandbox{
			Spec: spec, ID: spec.ID, Node: f.name, State: node.StateRunning,
			CreatedAt: now, LastActivity: now,
			Runtime: runtime.State{ID: spec.ID, Pid: 4242, Dir: root, CreatedAt: now},
		},
		execs: map[string]*fakeExec{},
	}
	f.sbs[spec.ID] = sb
	if f.FailCreate != nil {
		if err := f.FailCreate(spec); err != nil {
			if !f.CreateLeaks {
				delete(f.sbs, spec.ID)
				_ = os.RemoveAll(root)
			}
			return nil, err
		}
	}
	rec := sb.rec
	return &rec, nil
}

// GetSandbox implements node.Agent.
func (f *Fake) GetSandbox(ctx context.Context, id string) (*node.Sandbox, error) {
	f.count("GetSandbox")
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.get(id)
	if err != nil {
		return nil, err
	}
	rec := sb.rec
	return &rec, nil
}

// ListSandboxes implements node.Agent.
func (f *Fake) ListSandboxes(ctx context.Context) ([]node.Sandbox, error) {
	f.count("ListSandboxes")
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]node.Sandbox, 0, len(f.sbs))
	for _, sb := range f.sbs {
		out = append(out, sb.rec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func (f *Fake) transition(id, from, to string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.get(id)
	if err != nil {
		return err
	}
	if sb.rec.State != from {
		return fmt.Errorf("sandbox %s is %s, not %s: %w", id, sb.rec.State, from, errdefs.ErrFailedPrecondition)
	}
	sb.rec.State = to
	return nil
}

// PauseSandbox implements node.Agent.
func (f *Fake) PauseSandbox(ctx context.Context, id string) error {
	f.count("PauseSandbox")
	return f.transition(id, node.StateRunning, node.StatePaused)
}

// ResumeSandbox implements node.Agent.
func (f *Fake) ResumeSandbox(ctx context.Context, id string) error {
	f.count("ResumeSandbox")
	return f.transition(id, node.StatePaused, node.StateRunning)
}

// DeleteSandbox implements node.Agent.
func (f *Fake) DeleteSandbox(ctx context.Context, id string) error {
	f.count("DeleteSandbox")
	f.mu.Lock()
	sb, err := f.get(id)
	if err == nil {
		delete(f.sbs, id)
	}
	f.mu.Unlock()
	if err != nil {
		return err
	}
	for _, e := range sb.execs {
		e.kill(9)
	}
	return os.RemoveAll(filepath.Join(f.dir, id))
}

// SandboxStats implements node.Agent.
func (f *Fake) SandboxStats(ctx context.Context, id string) (*node.SandboxStats, error) {
	f.count("SandboxStats")
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.get(id)
	if err != nil {
		return nil, err
	}
	s := sb.rec.Spec
	return &node.SandboxStats{
		ID: id, State: sb.rec.State, CPURequested: s.CPU, CPUUsed: s.CPU / 2,
		MemoryLimitBytes: s.MemoryBytes, MemoryHeldBytes: s.MemoryBytes / 2,
	}, nil
}

// SetNetwork implements node.Agent.
func (f *Fake) SetNetwork(ctx context.Context, id string, p node.NetworkPolicy) error {
	f.count("SetNetwork")
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.get(id)
	if err != nil {
		return err
	}
	sb.network = p
	return nil
}

// Network returns the policy last set on a sandbox.
func (f *Fake) Network(id string) node.NetworkPolicy {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb := f.sbs[id]; sb != nil {
		return sb.network
	}
	return node.NetworkPolicy{}
}

// Snapshot implements node.Agent; it returns imageRef.
func (f *Fake) Snapshot(ctx context.Context, id, imageRef string) (string, error) {
	f.count("Snapshot")
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.get(id)
	if err != nil {
		return "", err
	}
	if sb.rec.State != node.StateRunning && sb.rec.State != node.StatePaused {
		return "", fmt.Errorf("sandbox %s is %s: %w", id, sb.rec.State, errdefs.ErrFailedPrecondition)
	}
	f.images[imageRef] = id
	return imageRef, nil
}

// SnapshotSource returns the sandbox a snapshot ref was taken from.
func (f *Fake) SnapshotSource(ref string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id, ok := f.images[ref]
	return id, ok
}

func copyTree(src, dst string) error {
	return filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		if fi.IsDir() {
			return os.MkdirAll(target, fi.Mode().Perm())
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm())
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}

func splitArgs(req node.ExecRequest) []string {
	if req.Shell != "" {
		return strings.Fields(req.Shell)
	}
	return req.Args
}
