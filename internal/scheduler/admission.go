package scheduler

import (
	"errors"
	"fmt"
	"math"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Resource names, as used in refusals and node.Capacity.
const (
	ResourceCPU       = "cpu"
	ResourceMemory    = "memory"
	ResourcePids      = "pids"
	ResourceDisk      = "disk"
	ResourceSandboxes = "sandboxes"
)

// NodeUsage is what a node measures about itself. Quantities a node does
// not track are left zero and then do not limit.
type NodeUsage struct {
	CPUs float64 `json:"cpus"` // cores
	// CPUUsedP95 is the sum over the node's sandboxes of each one's p95
	// CPU rate over the measuring window, in cores.
	CPUUsedP95 float64 `json:"cpu_used_p95"`
	// MemoryTotal and MemoryHeld: physical memory and what is actually
	// held now (Total - MemAvailable: sandboxes, system, caches that
	// cannot be dropped).
	MemoryTotal int64 `json:"memory_total"`
	MemoryHeld  int64 `json:"memory_held"`
	PidsMax     int64 `json:"pids_max"`
	PidsUsed    int64 `json:"pids_used"`
	DiskTotal   int64 `json:"disk_total"`
	DiskUsed    int64 `json:"disk_used"`
	Sandboxes   int   `json:"sandboxes"`
}

// Shape is one sandbox as the caller asks for it.
type Shape struct {
	CPU         float64 `json:"cpu"`          // requested cores
	MemoryBytes int64   `json:"memory_bytes"` // limit
	// ExpectedCPU / ExpectedMemory are what the sandbox is expected to
	// use; 0 takes Policy.ExpectedCPUFraction of CPU and
	// Policy.ExpectedMemoryFraction of MemoryBytes.
	ExpectedCPU    float64 `json:"expected_cpu"`
	ExpectedMemory int64   `json:"expected_memory"`
	Pids           int64   `json:"pids"`
	DiskBytes      int64   `json:"disk_bytes"`
}

// Policy is the node's admission policy.
type Policy struct {
	// CPUOvercommit multiplies the node's cores: admit while measured p95
	// use plus the newcomer's expected use stays under CPUs*CPUOvercommit.
	CPUOvercommit float64 `json:"cpu_overcommit"`
	// MemoryReserve is kept free for the host and for bursts.
	MemoryReserve int64 `json:"memory_reserve"`
	// Defaults for a shape's expected use, as fractions of its request.
	ExpectedCPUFraction    float64 `json:"expected_cpu_fraction"`
	ExpectedMemoryFraction float64 `json:"expected_memory_fraction"`
	// MaxSandboxes caps the count per node; 0 = no cap.
	MaxSandboxes int `json:"max_sandboxes"`
}

// DefaultPolicy: 4x CPU overcommit (agent sandboxes mostly wait), a 512
// MiB memory reserve, and newcomers expected to use their full request
// until measured.
func DefaultPolicy() Policy {
	return Policy{CPUOvercommit: 4, MemoryReserve: 512 << 20, ExpectedCPUFraction: 1, ExpectedMemoryFraction: 1}
}

// Validate reports a policy that cannot be applied.
func (p Policy) Validate() error {
	switch {
	case !(p.CPUOvercommit > 0) || math.IsInf(p.CPUOvercommit, 0):
		return fmt.Errorf("scheduler: cpu overcommit %v must be > 0: %w", p.CPUOvercommit, errdefs.ErrInvalidArgument)
	case p.MemoryReserve < 0:
		return fmt.Errorf("scheduler: negative memory reserve: %w", errdefs.ErrInvalidArgument)
	case !(p.ExpectedCPUFraction > 0 && p.ExpectedCPUFraction <= 1):
		return fmt.Errorf("scheduler: expected cpu fraction %v outside (0,1]: %w", p.ExpectedCPUFraction, errdefs.ErrInvalidArgument)
	case !(p.ExpectedMemoryFraction > 0 && p.ExpectedMemoryFraction <= 1):
		return fmt.Errorf("scheduler: expected memory fraction %v outside (0,1]: %w", p.ExpectedMemoryFraction, errdefs.ErrInvalidArgument)
	case p.MaxSandboxes < 0:
		return fmt.Errorf("scheduler: negative max sandboxes: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// Validate reports a shape that cannot be placed.
func (s Shape) Validate() error {
	bad := func(what string) error {
		return fmt.Errorf("scheduler: shape %s: %w", what, errdefs.ErrInvalidArgument)
	}
	switch {
	case s.CPU < 0 || math.IsNaN(s.CPU) || math.IsInf(s.CPU, 0):
		return bad(fmt.Sprintf("cpu %v", s.CPU))
	case s.ExpectedCPU < 0 || math.IsNaN(s.ExpectedCPU) || math.IsInf(s.ExpectedCPU, 0):
		return bad(fmt.Sprintf("expected cpu %v", s.ExpectedCPU))
	case s.MemoryBytes < 0, s.ExpectedMemory < 0, s.Pids < 0, s.DiskBytes < 0:
		return bad("has a negative quantity")
	case s.CPU == 0 && s.ExpectedCPU == 0:
		return bad("asks for no cpu")
	case s.MemoryBytes == 0 && s.ExpectedMemory == 0:
		return bad("asks for no memory")
	case s.MemoryBytes > 0 && s.ExpectedMemory > s.MemoryBytes:
		return bad("expects more memory than its limit")
	}
	return nil
}

func (s Shape) expected(p Policy) (cpu float64, mem int64) {
	cpu, mem = s.ExpectedCPU, s.ExpectedMemory
	if cpu == 0 {
		cpu = s.CPU * p.ExpectedCPUFraction
	}
	if mem == 0 {
		mem = int64(float64(s.MemoryBytes) * p.ExpectedMemoryFraction)
	}
	return cpu, mem
}

// Admit decides whether one more sandbox of shape fits on node under cfg,
// from measured use. A refusal's reason names the short resource first
// ("cpu: ...", "memory: ...").
func Admit(node NodeUsage, shape Shape, cfg Policy) (ok bool, reason string) {
	if err := Check(node, shape, cfg); err != nil {
		return false, reasonOf(err)
	}
	return true, ""
}

// refusal carries the short resource with the reason.
type refusal struct {
	resource, detail string
}

func (r *refusal) Error() string { return r.resource + ": " + r.detail }
func (r *refusal) Unwrap() error { return errdefs.ErrResourceExhausted }

func reasonOf(err error) string {
	var r *refusal
	if errors.As(err, &r) {
		return r.Error()
	}
	return err.Error()
}

// ShortResource returns the resource a Check refusal names, or "".
func ShortResource(err error) string {
	var r *refusal
	if errors.As(err, &r) {
		return r.resource
	}
	return ""
}

// Check is Admit as an error: nil when admitted, an error wrapping
// errdefs.ErrResourceExhausted naming the short resource (ShortResource
// returns it) when not, errdefs.ErrInvalidArgument for a bad shape or
// policy.
func Check(node NodeUsage, shape Shape, cfg Policy) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := shape.Validate(); err != nil {
		return err
	}
	cpu, mem := shape.expected(cfg)
	if capCPU := node.CPUs * cfg.CPUOvercommit; node.CPUs > 0 && node.CPUUsedP95+cpu > capCPU+1e-9 {
		return &refusal{ResourceCPU, fmt.Sprintf("measured p95 use %.2f + expected %.2f cores exceeds capacity %.2f (%.0f cores x %.2f overcommit)",
			node.CPUUsedP95, cpu, capCPU, node.CPUs, cfg.CPUOvercommit)}
	}
	if node.MemoryTotal > 0 && node.MemoryHeld+mem+cfg.MemoryReserve > node.MemoryTotal {
		return &refusal{ResourceMemory, fmt.Sprintf("held %s + expected %s + reserve %s exceeds total %s",
			mib(node.MemoryHeld), mib(mem), mib(cfg.MemoryReserve), mib(node.MemoryTotal))}
	}
	if node.PidsMax > 0 && shape.Pids > 0 && node.PidsUsed+shape.Pids > node.PidsMax {
		return &refusal{ResourcePids, fmt.Sprintf("%d in use + %d asked exceeds %d", node.PidsUsed, shape.Pids, node.PidsMax)}
	}
	if node.DiskTotal > 0 && shape.DiskBytes > 0 && node.DiskUsed+shape.DiskBytes > node.DiskTotal {
		return &refusal{ResourceDisk, fmt.Sprintf("%s used + %s asked exceeds %s", mib(node.DiskUsed), mib(shape.DiskBytes), mib(node.DiskTotal))}
	}
	if cfg.MaxSandboxes > 0 && node.Sandboxes+1 > cfg.MaxSandboxes {
		return &refusal{ResourceSandboxes, fmt.Sprintf("%d running, node cap %d", node.Sandboxes, cfg.MaxSandboxes)}
	}
	return nil
}

// Capacity tells how many more sandboxes of shape fit on node, which
// resource runs out first, and how many fit by each resource that limits
// at all. A bad shape or policy fits 0 with limiting "invalid".
func Capacity(node NodeUsage, shape Shape, cfg Policy) (fits int, limiting string, perResource map[string]int) {
	if cfg.Validate() != nil || shape.Validate() != nil {
		return 0, "invalid", nil
	}
	cpu, mem := shape.expected(cfg)
	perResource = map[string]int{}
	if node.CPUs > 0 && cpu > 0 {
		perResource[ResourceCPU] = count(node.CPUs*cfg.CPUOvercommit-node.CPUUsedP95, cpu)
	}
	if node.MemoryTotal > 0 && mem > 0 {
		perResource[ResourceMemory] = count(float64(node.MemoryTotal-cfg.MemoryReserve-node.MemoryHeld), float64(mem))
	}
	if node.PidsMax > 0 && shape.Pids > 0 {
		perResource[ResourcePids] = count(float64(node.PidsMax-node.PidsUsed), float64(shape.Pids))
	}
	if node.DiskTotal > 0 && shape.DiskBytes > 0 {
		perResource[ResourceDisk] = count(float64(node.DiskTotal-node.DiskUsed), float64(shape.DiskBytes))
	}
	if cfg.MaxSandboxes > 0 {
		perResource[ResourceSandboxes] = max(0, cfg.MaxSandboxes-node.Sandboxes)
	}
	fits = math.MaxInt
	for _, r := range []string{ResourceCPU, ResourceMemory, ResourcePids, ResourceDisk, ResourceSandboxes} {
		if n, ok := perResource[r]; ok && n < fits {
			fits, limiting = n, r
		}
	}
	if limiting == "" { // nothing measured limits: the node reports nothing
		return 0, "unknown", perResource
	}
	return fits, limiting, perResource
}

// count is floor(free/unit) with a small tolerance, never negative.
func count(free, unit float64) int {
	if free <= 0 || unit <= 0 {
		return 0
	}
	n := math.Floor(free/unit + 1e-9)
	if n > math.MaxInt32 {
		return math.MaxInt32
	}
	return int(n)
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }
