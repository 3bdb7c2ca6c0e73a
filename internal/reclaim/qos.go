package reclaim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// QoS classes (the same strings as node.QoS*).
const (
	ClassLatency  = "latency"
	ClassStandard = "standard"
	ClassBatch    = "batch"
)

// Class weights: latency gets 10x a standard sandbox's share under
// contention, batch runs only on otherwise idle CPU.
const (
	WeightLatency  = 1000
	WeightStandard = 100
)

// ApplyClass returns r adjusted for a QoS class: the cgroup weight and,
// for batch, cpu.idle (v2 and v1 kernels with cpu.idle) which makes the
// group's tasks SCHED_IDLE-like relative to the others. On a v1 kernel
// without cpu.idle callers use SetSchedIdle on the tasks instead (see
// NeedsTaskSchedIdle). "" means standard.
func ApplyClass(class string, r cgroups.Resources) (cgroups.Resources, error) {
	switch class {
	case ClassLatency:
		r.CPUWeight, r.CPUIdle = WeightLatency, false
	case ClassStandard, "":
		r.CPUWeight, r.CPUIdle = WeightStandard, false
	case ClassBatch:
		r.CPUWeight, r.CPUIdle = 0, true
	default:
		return r, fmt.Errorf("reclaim: QoS class %q (want latency, standard or batch): %w", class, errdefs.ErrInvalidArgument)
	}
	return r, nil
}

// NeedsTaskSchedIdle reports whether a batch group's tasks must be made
// SCHED_IDLE one by one: true on v1 when the cpu hierarchy has no
// cpu.idle. g's cpu path is looked up in Paths (v1 "cpu", v2 "").
func NeedsTaskSchedIdle(g cgroups.Group) bool {
	p := g.Paths()
	dir, ok := p["cpu"]
	if !ok {
		dir = p[""]
	}
	_, err := os.Stat(filepath.Join(dir, "cpu.idle"))
	return err != nil
}

// SetSchedIdle switches every thread of pid to SCHED_IDLE (idle=true) or
// back to SCHED_OTHER nice 0 (idle=false) with sched_setattr. Threads that
// exit meanwhile are skipped.
func SetSchedIdle(pid int, idle bool) error {
	policy := uint32(unix.SCHED_NORMAL)
	if idle {
		policy = unix.SCHED_IDLE
	}
	tids, err := threads(pid)
	if err != nil {
		return err
	}
	for _, tid := range tids {
		attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: policy}
		if err := unix.SchedSetAttr(tid, &attr, 0); err != nil {
			if errors.Is(err, unix.ESRCH) {
				continue
			}
			if errors.Is(err, unix.EPERM) {
				return fmt.Errorf("reclaim: sched_setattr tid %d: %w: %w", tid, err, errdefs.ErrPermissionDenied)
			}
			return fmt.Errorf("reclaim: sched_setattr tid %d: %w", tid, err)
		}
	}
	return nil
}

// SchedPolicy returns the scheduling policy of pid's main thread.
func SchedPolicy(pid int) (uint32, error) {
	a, err := unix.SchedGetAttr(pid, 0)
	if err != nil {
		return 0, fmt.Errorf("reclaim: sched_getattr %d: %w", pid, err)
	}
	return a.Policy, nil
}

func threads(pid int) ([]int, error) {
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("reclaim: pid %d: %w", pid, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("reclaim: %w", err)
	}
	out := make([]int, 0, len(ents))
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, tid)
		}
	}
	return out, nil
}

// SchedCoreAvailable reports whether core scheduling (CONFIG_SCHED_CORE,
// prctl PR_SCHED_CORE) exists: without it, a latency sandbox cannot be
// kept off the SMT sibling of another tenant's thread.
func SchedCoreAvailable() bool {
	var cookie uint64
	// PR_SCHED_CORE_GET for this thread; EINVAL when the kernel lacks it.
	err := unix.PrctlArg5Ptr(unix.PR_SCHED_CORE, unix.PR_SCHED_CORE_GET, 0, 0 /* PIDTYPE_PID */, unsafe.Pointer(&cookie))
	return err == nil
}

// SchedCoreCreate gives pid's whole thread group a new core-scheduling
// cookie, so only its own threads share a core's SMT siblings.
func SchedCoreCreate(pid int) error {
	const pidtypeTGID = 1
	if err := unix.Prctl(unix.PR_SCHED_CORE, unix.PR_SCHED_CORE_CREATE, uintptr(pid), pidtypeTGID, 0); err != nil {
		if errors.Is(err, unix.EINVAL) && !SchedCoreAvailable() {
			return fmt.Errorf("reclaim: core scheduling (CONFIG_SCHED_CORE) not in this kernel: %w", errdefs.ErrNotImplemented)
		}
		return fmt.Errorf("reclaim: PR_SCHED_CORE_CREATE pid %d: %w", pid, err)
	}
	return nil
}

// KSM (kernel same-page merging) merges identical pages of every process
// that opted in, system wide: it cannot be told to merge only within a
// group. Merging across tenants would let one tenant time another's
// copy-on-write faults, so dsec lets at most one tenant per node opt in:
// KSMDomain hands the node's KSM to the first tenant that asks and refuses
// others until that tenant's last sandbox is gone.
//
// Opting a process in: PR_SET_MEMORY_MERGE only acts on the calling
// process (and process_madvise does not accept MADV_MERGEABLE), so it is
// set by the process itself before it execs the sandbox's init (the exec
// shim calls EnableMemoryMergeSelf); the flag survives fork and execve
// (kernel >= 6.7), so every process of the sandbox inherits it.
type KSMDomain struct {
	mu        sync.Mutex
	tenant    string
	sandboxes map[string]bool
}

// Claim registers sandbox of tenant as a KSM user. It fails with
// errdefs.ErrFailedPrecondition if another tenant holds the node's KSM.
func (d *KSMDomain) Claim(tenant, sandbox string) error {
	if tenant == "" || sandbox == "" {
		return fmt.Errorf("reclaim: KSM claim needs tenant and sandbox: %w", errdefs.ErrInvalidArgument)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.tenant != "" && d.tenant != tenant {
		return fmt.Errorf("reclaim: KSM on this node is in use by another tenant; merging across tenants is not allowed: %w", errdefs.ErrFailedPrecondition)
	}
	if d.sandboxes == nil {
		d.sandboxes = map[string]bool{}
	}
	d.tenant = tenant
	d.sandboxes[sandbox] = true
	return nil
}

// Release drops sandbox; the domain frees up when its last sandbox goes.
func (d *KSMDomain) Release(sandbox string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.sandboxes, sandbox)
	if len(d.sandboxes) == 0 {
		d.tenant = ""
	}
}

// Tenant returns the tenant holding the domain, or "".
func (d *KSMDomain) Tenant() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.tenant
}

// EnableMemoryMergeSelf opts the calling process (and what it forks and
// execs) into KSM. Called by the exec shim before it execs sandbox code.
func EnableMemoryMergeSelf() error {
	if err := unix.Prctl(unix.PR_SET_MEMORY_MERGE, 1, 0, 0, 0); err != nil {
		if errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("reclaim: PR_SET_MEMORY_MERGE (kernel >= 6.4 with CONFIG_KSM): %w", errdefs.ErrNotImplemented)
		}
		return fmt.Errorf("reclaim: PR_SET_MEMORY_MERGE: %w", err)
	}
	return nil
}

// KSMStat is /proc/PID/ksm_stat.
type KSMStat struct {
	MergeAny      bool  // process opted in with PR_SET_MEMORY_MERGE
	MergingPages  int64 // pages of the process currently merged
	ProcessProfit int64
}

// ReadKSMStat reads /proc/PID/ksm_stat.
func ReadKSMStat(pid int) (KSMStat, error) {
	name := "/proc/" + strconv.Itoa(pid) + "/ksm_stat"
	b, err := os.ReadFile(name)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return KSMStat{}, fmt.Errorf("reclaim: %s: %w", name, errdefs.ErrNotFound)
		}
		return KSMStat{}, fmt.Errorf("reclaim: %w", err)
	}
	var s KSMStat
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		switch f[0] {
		case "ksm_merge_any:":
			s.MergeAny = f[1] == "yes"
		case "ksm_merging_pages":
			s.MergingPages, _ = strconv.ParseInt(f[1], 10, 64)
		case "ksm_process_profit":
			s.ProcessProfit, _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	return s, nil
}

// KSMRun reads and sets /sys/kernel/mm/ksm/run (0 stop, 1 run). Set
// returns the previous value so the caller can restore it.
func KSMRun(sysfs string) (string, error) {
	b, err := os.ReadFile(filepath.Join(sysfs, "kernel/mm/ksm/run"))
	if err != nil {
		return "", fmt.Errorf("reclaim: KSM (CONFIG_KSM) not available: %w", errdefs.ErrNotImplemented)
	}
	return strings.TrimSpace(string(b)), nil
}

// SetKSMRun writes v ("0" or "1") to ksm/run and returns the old value.
func SetKSMRun(sysfs, v string) (string, error) {
	old, err := KSMRun(sysfs)
	if err != nil {
		return "", err
	}
	if v != "0" && v != "1" {
		return old, fmt.Errorf("reclaim: ksm run %q (want 0 or 1): %w", v, errdefs.ErrInvalidArgument)
	}
	if err := writeSys(filepath.Join(sysfs, "kernel/mm/ksm"), "run", v); err != nil {
		return old, fmt.Errorf("reclaim: %w", err)
	}
	return old, nil
}
