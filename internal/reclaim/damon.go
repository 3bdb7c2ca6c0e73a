package reclaim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// DAMONStatus says whether dsec could run its own DAMON context.
type DAMONStatus struct {
	// Present: the DAMON sysfs interface exists (CONFIG_DAMON_SYSFS).
	Present bool `json:"present"`
	// Kdamonds is how many kdamond directories exist, Running how many
	// of them are "on".
	Kdamonds int `json:"kdamonds"`
	Running  int `json:"running"`
	// Operations are the monitoring operation sets the kernel offers
	// ("vaddr", "fvaddr", "paddr"); vaddr is the one that can watch one
	// sandbox's processes.
	Operations []string `json:"operations,omitempty"`
	// CanStart: a new kdamond could be added now.
	CanStart bool `json:"can_start"`
	// Reason explains CanStart=false (or a limitation when true).
	Reason string `json:"reason,omitempty"`
}

// DetectDAMON inspects sysfs/kernel/mm/damon/admin (sysfs normally "/sys")
// without disturbing any running context. The sysfs interface can only
// change the number of kdamonds while none runs: if one runs, dsec
// confirms the refusal by re-writing the current count, which the kernel
// rejects with EBUSY before touching anything. When none runs nothing is
// written (a write would recreate the directories and lose an idle
// context's setup).
func DetectDAMON(sysfs string) DAMONStatus {
	dir := filepath.Join(sysfs, "kernel/mm/damon/admin/kdamonds")
	var st DAMONStatus
	b, err := os.ReadFile(filepath.Join(dir, "nr_kdamonds"))
	if err != nil {
		st.Reason = "no DAMON sysfs interface (CONFIG_DAMON_SYSFS off)"
		return st
	}
	st.Present = true
	st.Kdamonds, err = strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		st.Reason = fmt.Sprintf("unreadable nr_kdamonds %q", strings.TrimSpace(string(b)))
		return st
	}
	for i := 0; i < st.Kdamonds; i++ {
		s, _ := os.ReadFile(filepath.Join(dir, strconv.Itoa(i), "state"))
		if strings.TrimSpace(string(s)) == "on" {
			st.Running++
		}
		if st.Operations == nil {
			if ops, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(i), "contexts/0/avail_operations")); err == nil {
				st.Operations = strings.Fields(string(ops))
			}
		}
	}
	hasVaddr := false
	for _, o := range st.Operations {
		hasVaddr = hasVaddr || o == "vaddr"
	}
	const noVaddr = "only physical-address monitoring (no CONFIG_DAMON_VADDR): node-wide, not per sandbox"
	if st.Running > 0 {
		err := writeSys(dir, "nr_kdamonds", strconv.Itoa(st.Kdamonds))
		switch {
		case errors.Is(err, unix.EBUSY):
			st.Reason = fmt.Sprintf("%d kdamond(s) already running; the kernel refuses (EBUSY) to add another while one runs", st.Running)
			if st.Operations != nil && !hasVaddr {
				st.Reason += "; and " + noVaddr
			}
		case err != nil:
			st.Reason = fmt.Sprintf("kdamond running and nr_kdamonds not writable: %v", err)
		default:
			// Accepted: only possible on kernels that allow it.
			st.CanStart = true
		}
		return st
	}
	st.CanStart = true
	if st.Operations != nil && !hasVaddr {
		st.Reason = noVaddr
	}
	return st
}
