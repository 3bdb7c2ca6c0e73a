package reclaim

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Mapping is one line of /proc/PID/maps.
type Mapping struct {
	Start, End uint64
	Perms      string
	Inode      uint64
	Path       string
}

// Anon reports whether the mapping is anonymous memory (heap, stack,
// private anonymous or named anon regions).
func (m Mapping) Anon() bool {
	if m.Inode != 0 {
		return false
	}
	return m.Path == "" || m.Path == "[heap]" || m.Path == "[stack]" || strings.HasPrefix(m.Path, "[anon:")
}

// File reports whether the mapping is backed by a regular file.
func (m Mapping) File() bool { return m.Inode != 0 && strings.HasPrefix(m.Path, "/") }

// pageoutable excludes what MADV_PAGEOUT refuses (EINVAL for VM_PFNMAP,
// VM_LOCKED, VM_HUGETLB: [vvar], [vsyscall], hugetlbfs) or that is never
// worth it ([vdso]). A refused range would cut the process_madvise batch
// short, so they are filtered here.
func (m Mapping) pageoutable() bool {
	if strings.HasPrefix(m.Path, "[") && !m.Anon() {
		return false
	}
	if strings.Contains(m.Path, "anon_hugepage") || strings.HasPrefix(m.Path, "/SYSV") {
		return false
	}
	return m.End > m.Start
}

// ParseMaps parses /proc/PID/maps content.
func ParseMaps(name string, b []byte) ([]Mapping, error) {
	var out []Mapping
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if text == "" {
			continue
		}
		// start-end perms offset dev inode [path, may contain spaces]
		f := strings.SplitN(text, " ", 6)
		bad := func(why string) error {
			return fmt.Errorf("reclaim: malformed %s line %d %q: %s: %w", name, line, text, why, errdefs.ErrInvalidArgument)
		}
		if len(f) < 5 {
			return nil, bad("too few fields")
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			return nil, bad("address range without '-'")
		}
		var m Mapping
		var err error
		if m.Start, err = strconv.ParseUint(lo, 16, 64); err != nil {
			return nil, bad("start address")
		}
		if m.End, err = strconv.ParseUint(hi, 16, 64); err != nil || m.End < m.Start {
			return nil, bad("end address")
		}
		if m.Inode, err = strconv.ParseUint(f[4], 10, 64); err != nil {
			return nil, bad("inode")
		}
		m.Perms = f[1]
		if len(f) == 6 {
			m.Path = strings.TrimLeft(f[5], " ")
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// PageoutKinds selects which mappings Pageout advises. Anonymous memory
// can only go out when there is swap; file pages are simply dropped (or
// written back if dirty) and faulted in again on use.
type PageoutKinds struct {
	Anon bool
	File bool
}

// PageoutResult counts what Pageout did.
type PageoutResult struct {
	Processes int   // processes advised
	Gone      int   // processes that exited meanwhile
	Ranges    int   // mappings advised
	Bytes     int64 // bytes of address space advised (not bytes freed)
}

// iovMax is UIO_MAXIOV, the kernel's cap on one process_madvise vector.
const iovMax = 1024

// Pageout asks the kernel to reclaim the selected mappings of each process
// now (process_madvise(MADV_PAGEOUT) through a pidfd, so a recycled pid
// can never be hit). Pages that are in use by other processes stay. It
// needs CAP_SYS_NICE and ptrace-read access to the targets. The memory
// comes back transparently when touched; nothing is killed.
func Pageout(ctx context.Context, pids []int, kinds PageoutKinds) (PageoutResult, error) {
	var res PageoutResult
	if !kinds.Anon && !kinds.File {
		return res, fmt.Errorf("reclaim: pageout of neither anon nor file mappings: %w", errdefs.ErrInvalidArgument)
	}
	for _, pid := range pids {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("reclaim: pageout: %w: %w", err, errdefs.ErrDeadlineExceeded)
		}
		n, b, err := pageoutPid(pid, kinds)
		switch {
		case errors.Is(err, unix.ESRCH), errors.Is(err, os.ErrNotExist):
			res.Gone++
			continue
		case errors.Is(err, unix.EPERM):
			return res, fmt.Errorf("reclaim: pageout pid %d: %w: %w", pid, err, errdefs.ErrPermissionDenied)
		case errors.Is(err, unix.ENOSYS):
			return res, fmt.Errorf("reclaim: process_madvise: %w: %w", err, errdefs.ErrNotImplemented)
		case err != nil:
			return res, fmt.Errorf("reclaim: pageout pid %d: %w", pid, err)
		}
		res.Processes++
		res.Ranges += n
		res.Bytes += b
	}
	return res, nil
}

func pageoutPid(pid int, kinds PageoutKinds) (int, int64, error) {
	// Open the pidfd first: the maps read after it then belong to the
	// same process, or the process is gone and process_madvise fails.
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return 0, 0, err
	}
	defer unix.Close(pidfd)
	name := "/proc/" + strconv.Itoa(pid) + "/maps"
	b, err := os.ReadFile(name)
	if err != nil {
		return 0, 0, err
	}
	maps, err := ParseMaps(name, b)
	if err != nil {
		return 0, 0, err
	}
	var iov []remoteIovec
	for _, m := range maps {
		if !m.pageoutable() || !(kinds.Anon && m.Anon() || kinds.File && m.File()) {
			continue
		}
		iov = append(iov, remoteIovec{base: uintptr(m.Start), len: uint64(m.End - m.Start)})
	}
	var total int64
	ranges := 0
	for len(iov) > 0 {
		batch := iov[:min(len(iov), iovMax)]
		n, err := processMadvise(pidfd, batch, unix.MADV_PAGEOUT)
		if err != nil && n == 0 {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOMEM) {
				// The first range vanished or changed (munmap, mlock) since
				// maps was read: skip it, keep going.
				iov = iov[1:]
				continue
			}
			return ranges, total, err
		}
		// The kernel stops at the first range it refuses and returns the
		// bytes done so far: advance past the done ranges and the refused
		// one.
		done, i := int64(0), 0
		for i < len(batch) && done+int64(batch[i].len) <= n {
			done += int64(batch[i].len)
			i++
		}
		total += done
		ranges += i
		if i < len(batch) {
			i++ // the refused range
		}
		iov = iov[i:]
	}
	return ranges, total, nil
}

// remoteIovec is struct iovec holding an address in another process: a
// uintptr, since it must never be dereferenced or tracked by the GC here.
type remoteIovec struct {
	base uintptr
	len  uint64
}

func processMadvise(pidfd int, iov []remoteIovec, advice int) (int64, error) {
	r, _, e := unix.Syscall6(unix.SYS_PROCESS_MADVISE, uintptr(pidfd),
		uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)), uintptr(advice), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int64(r), nil
}

// ProcMemory is a process's resident memory by kind, from /proc/PID/status.
type ProcMemory struct {
	RSS, RssAnon, RssFile, RssShmem, Swap int64
}

// ReadProcMemory reads /proc/PID/status.
func ReadProcMemory(pid int) (ProcMemory, error) {
	name := "/proc/" + strconv.Itoa(pid) + "/status"
	b, err := os.ReadFile(name)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return ProcMemory{}, fmt.Errorf("reclaim: pid %d: %w", pid, errdefs.ErrNotFound)
		}
		return ProcMemory{}, fmt.Errorf("reclaim: %w", err)
	}
	var pm ProcMemory
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		var dst *int64
		switch k {
		case "VmRSS":
			dst = &pm.RSS
		case "RssAnon":
			dst = &pm.RssAnon
		case "RssFile":
			dst = &pm.RssFile
		case "RssShmem":
			dst = &pm.RssShmem
		case "VmSwap":
			dst = &pm.Swap
		default:
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return pm, fmt.Errorf("reclaim: malformed %s line %q: %w", name, line, errdefs.ErrInvalidArgument)
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return pm, fmt.Errorf("reclaim: malformed %s line %q: %w", name, line, errdefs.ErrInvalidArgument)
		}
		*dst = n * 1024
	}
	return pm, nil
}
