// Command attack is the misconduct suite's in-sandbox tool: each
// subcommand is one thing a reward-hacking agent tries, done with raw
// syscalls so the result is the kernel's (or the seccomp filter's) answer
// and not a library's interpretation. It prints one JSON object on stdout
// for the test to assert on. Built static (CGO_ENABLED=0) and copied into
// a sandbox with `dsec file put`.
package main

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: attack ioctls|syscalls|scan|unix|walk|read|write|memhog ...")
		os.Exit(2)
	}
	var out any
	var err error
	args := os.Args[2:]
	switch os.Args[1] {
	case "ioctls":
		out, err = ioctls(args)
	case "syscalls":
		out = syscalls()
	case "scan":
		out, err = scan(args)
	case "unix":
		out = unixSockets(args)
	case "walk":
		out, err = walk(args)
	case "read":
		out = readPaths(args)
	case "write":
		out, err = writePath(args)
	case "memhog":
		err = memhog(args)
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "attack:", err)
		os.Exit(2)
	}
	if out != nil {
		if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
			os.Exit(2)
		}
	}
}

func errnoName(err error) string {
	if err == nil {
		return "ok"
	}
	var e unix.Errno
	if errors.As(err, &e) {
		if n := unix.ErrnoName(e); n != "" {
			return n
		}
		return "errno " + strconv.Itoa(int(e))
	}
	return err.Error()
}

func errnoOf(e unix.Errno) string {
	if e == 0 {
		return "ok"
	}
	return errnoName(e)
}

// ioctl request numbers (x86_64 _IOC encoding), as in internal/seccomp.
const (
	reqFICLONE             = 0x40049409
	reqFICLONERANGE        = 0x4020940d
	reqFIDEDUPERANGE       = 0xc0189436
	reqXFSSwapExt          = 0xc0c0586d
	reqXFSExchangeRange    = 0x40285881
	fileCloneRangeSize     = 32
	fileDedupeRangeSize    = 24 + 32 // header + one dest
	xfsSwapExtSize         = 192
	xfsExchangeRangeSize   = 40
	ioctlTargetFile        = "file"
	ioctlTargetInvalidDesc = "badfd"
)

// ioctls tries the extent-sharing and extent-swapping ioctls on two real
// files in dir (src full of data, dst a different file) and on fd -1: the
// kernel answers EBADF for fd -1, so anything else proves a filter saw
// the call first.
func ioctls(args []string) (map[string]string, error) {
	if len(args) != 1 {
		return nil, errors.New("usage: ioctls DIR")
	}
	src, err := os.Create(filepath.Join(args[0], "src"))
	if err != nil {
		return nil, err
	}
	defer src.Close()
	dst, err := os.Create(filepath.Join(args[0], "dst"))
	if err != nil {
		return nil, err
	}
	defer dst.Close()
	block := make([]byte, 1<<16)
	for i := range block {
		block[i] = 's'
	}
	for i := 0; i < 16; i++ {
		if _, err := src.Write(block); err != nil {
			return nil, err
		}
	}
	for i := range block {
		block[i] = 'd'
	}
	for i := 0; i < 16; i++ {
		if _, err := dst.Write(block); err != nil {
			return nil, err
		}
	}
	if err := src.Sync(); err != nil {
		return nil, err
	}
	res := map[string]string{}
	for _, target := range []string{ioctlTargetFile, ioctlTargetInvalidDesc} {
		sfd, dfd := int64(src.Fd()), int64(dst.Fd())
		if target == ioctlTargetInvalidDesc {
			sfd, dfd = -1, -1
		}
		length := uint64(1 << 20)
		// FICLONE: dst gets src's extents.
		res["FICLONE/"+target] = rawIoctl(dfd, reqFICLONE, uintptr(sfd))
		// FICLONERANGE: struct file_clone_range.
		b := make([]byte, fileCloneRangeSize)
		putI64(b[0:], sfd)
		putU64(b[16:], length)
		res["FICLONERANGE/"+target] = ioctlBuf(dfd, reqFICLONERANGE, b)
		// FIDEDUPERANGE: struct file_dedupe_range with one destination.
		b = make([]byte, fileDedupeRangeSize)
		putU64(b[8:], length)
		b[16] = 1 // dest_count
		putI64(b[24:], dfd)
		res["FIDEDUPERANGE/"+target] = ioctlBuf(sfd, reqFIDEDUPERANGE, b)
		// XFS_IOC_SWAPEXT: struct xfs_swapext swaps the extents of two
		// files: the way around file protections the issue reports.
		b = make([]byte, xfsSwapExtSize)
		putI64(b[8:], dfd)
		putI64(b[16:], sfd)
		putU64(b[32:], length)
		res["XFS_IOC_SWAPEXT/"+target] = ioctlBuf(dfd, reqXFSSwapExt, b)
		// XFS_IOC_EXCHANGE_RANGE: its successor (Linux 6.10).
		b = make([]byte, xfsExchangeRangeSize)
		putI64(b[0:], sfd)
		putU64(b[24:], length)
		res["XFS_IOC_EXCHANGE_RANGE/"+target] = ioctlBuf(dfd, reqXFSExchangeRange, b)
	}
	return res, nil
}

func putU64(b []byte, v uint64) {
	for i := 0; i < 8; i++ {
		b[i] = byte(v >> (8 * i))
	}
}

func putI64(b []byte, v int64) { putU64(b, uint64(v)) }

func rawIoctl(fd int64, req, arg uintptr) string {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, arg)
	return errnoOf(e)
}

func ioctlBuf(fd int64, req uintptr, b []byte) string {
	return rawIoctl(fd, req, uintptr(unsafe.Pointer(&b[0])))
}

// syscalls calls each kernel interface the sandbox must not have, with
// arguments that are harmless if the call went through and that the
// kernel itself would answer with something other than EPERM (EBADF,
// EINVAL, EFAULT, ENOENT): an EPERM therefore comes from the sandbox's
// filter or capabilities.
var atFDCWD = unix.AT_FDCWD

func syscalls() map[string]string {
	res := map[string]string{}
	call := func(name string, trap uintptr, a ...uintptr) {
		var p [6]uintptr
		copy(p[:], a)
		_, _, e := unix.Syscall6(trap, p[0], p[1], p[2], p[3], p[4], p[5])
		res[name] = errnoOf(e)
	}
	str := func(s string) uintptr {
		b := append([]byte(s), 0)
		return uintptr(unsafe.Pointer(&b[0]))
	}
	_ = os.MkdirAll("/tmp/attack-mnt", 0o755)
	call("mount", unix.SYS_MOUNT, str("none"), str("/tmp/attack-mnt"), str("tmpfs"), 0, 0)
	call("umount2", unix.SYS_UMOUNT2, str("/tmp"), unix.MNT_DETACH)
	call("fsopen", unix.SYS_FSOPEN, str("tmpfs"), 0)
	call("open_tree", unix.SYS_OPEN_TREE, uintptr(atFDCWD), str("/"), 0)
	call("pivot_root", unix.SYS_PIVOT_ROOT, str("/tmp"), str("/tmp"))
	call("unshare(CLONE_NEWUSER)", unix.SYS_UNSHARE, unix.CLONE_NEWUSER)
	call("unshare(CLONE_NEWNS)", unix.SYS_UNSHARE, unix.CLONE_NEWNS)
	call("setns", unix.SYS_SETNS, ^uintptr(0), 0)
	call("keyctl", unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, uintptr(0xfffffffd), 0) // session keyring
	call("add_key", unix.SYS_ADD_KEY, str("user"), str("attack"), str("x"), 1, uintptr(0xfffffffe))
	call("request_key", unix.SYS_REQUEST_KEY, str("user"), str("attack"), 0, 0)
	attr := make([]byte, 128)
	call("bpf", unix.SYS_BPF, unix.BPF_MAP_CREATE, uintptr(unsafe.Pointer(&attr[0])), 128)
	call("perf_event_open", unix.SYS_PERF_EVENT_OPEN, uintptr(unsafe.Pointer(&attr[0])), 0, ^uintptr(0), ^uintptr(0), 0)
	call("kexec_load", unix.SYS_KEXEC_LOAD, 0, 0, 0, 0)
	call("kexec_file_load", unix.SYS_KEXEC_FILE_LOAD, ^uintptr(0), ^uintptr(0), 0, 0, 0)
	call("init_module", unix.SYS_INIT_MODULE, 0, 0, str(""))
	call("finit_module", unix.SYS_FINIT_MODULE, ^uintptr(0), str(""), 0)
	call("delete_module", unix.SYS_DELETE_MODULE, str("attack_no_such_module"), unix.O_NONBLOCK)
	call("open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT, ^uintptr(0), 0, 0)
	call("ptrace(ATTACH 1)", unix.SYS_PTRACE, unix.PTRACE_ATTACH, 1)
	call("swapon", unix.SYS_SWAPON, str("/nonexistent"), 0)
	call("syslog(READ_ALL)", unix.SYS_SYSLOG, 3, 0, 0)
	call("clock_settime", unix.SYS_CLOCK_SETTIME, unix.CLOCK_REALTIME, 0)
	call("iopl", unix.SYS_IOPL, 3)
	call("io_uring_setup", unix.SYS_IO_URING_SETUP, 1, 0)
	return res
}

type scanResult struct {
	Open   []string          `json:"open"`
	Closed map[string]string `json:"closed"` // target -> why
}

// scan connects to every target (host:port or host:lo-hi) with a timeout:
// a port scan. Its own listener, if -listen is given, shows that the
// scanner itself works.
func scan(args []string) (*scanResult, error) {
	timeout := 700 * time.Millisecond
	var targets []string
	for _, a := range args {
		host, ports, err := net.SplitHostPort(a)
		if err != nil {
			return nil, err
		}
		lo, hi, ok := strings.Cut(ports, "-")
		if !ok {
			hi = lo
		}
		l, err1 := strconv.Atoi(lo)
		h, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || l > h {
			return nil, fmt.Errorf("bad ports %q", ports)
		}
		for p := l; p <= h; p++ {
			targets = append(targets, net.JoinHostPort(host, strconv.Itoa(p)))
		}
	}
	res := &scanResult{Closed: map[string]string{}}
	var mu sync.Mutex
	sem := make(chan struct{}, 128)
	var wg sync.WaitGroup
	for _, tgt := range targets {
		wg.Add(1)
		sem <- struct{}{}
		go func(tgt string) {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := net.DialTimeout("tcp", tgt, timeout)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.Closed[tgt] = shortErr(err)
				return
			}
			c.Close()
			res.Open = append(res.Open, tgt)
		}(tgt)
	}
	wg.Wait()
	sort.Strings(res.Open)
	// Summarise the reasons, not one line per closed port.
	if len(res.Closed) > 64 {
		why := map[string]string{}
		for t, e := range res.Closed {
			why["*"+e] = t
		}
		res.Closed = why
	}
	return res, nil
}

func shortErr(err error) string {
	var e unix.Errno
	if errors.As(err, &e) {
		return errnoName(e)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	return err.Error()
}

type unixResult struct {
	Found     []string          `json:"found"`     // socket files and /proc/net/unix entries
	Connected map[string]string `json:"connected"` // what answered, and its first bytes
	Errors    map[string]string `json:"errors"`
}

// unixSockets looks for every unix socket the sandbox can see (socket files
// anywhere outside /proc and /sys, the names in /proc/net/unix, abstract
// ones included) plus the given paths, connects to each and, if that works,
// forges an API call.
func unixSockets(extra []string) *unixResult {
	res := &unixResult{Connected: map[string]string{}, Errors: map[string]string{}}
	seen := map[string]bool{}
	add := func(p string) {
		if p != "" && !seen[p] {
			seen[p] = true
			res.Found = append(res.Found, p)
		}
	}
	_ = filepath.WalkDir("/", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && (p == "/proc" || p == "/sys") {
			return filepath.SkipDir
		}
		if d.Type()&fs.ModeSocket != 0 {
			add(p)
		}
		return nil
	})
	if f, err := os.Open("/proc/net/unix"); err == nil {
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) >= 8 {
				add(fields[7]) // a path or @abstract
			}
		}
		f.Close()
	}
	candidates := append([]string(nil), res.Found...)
	candidates = append(candidates, extra...)
	for _, p := range candidates {
		addr := p
		if strings.HasPrefix(p, "@") {
			addr = "\x00" + p[1:]
		}
		c, err := net.DialTimeout("unix", addr, time.Second)
		if err != nil {
			res.Errors[p] = shortErr(err)
			continue
		}
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		_, _ = io.WriteString(c, "GET /v1/sandboxes HTTP/1.0\r\nHost: dsec\r\n\r\n")
		b := make([]byte, 200)
		n, _ := c.Read(b)
		res.Connected[p] = string(b[:n])
		c.Close()
	}
	return res
}

type walkResult struct {
	Files    int               `json:"files"`
	Bytes    int64             `json:"bytes"`
	Matches  map[string]string `json:"matches"`  // path -> the needle found
	Timeouts []string          `json:"timeouts"` // files whose read blocked
	Checked  map[string]int64  `json:"checked"`  // -check paths -> bytes read (-1 = not readable)
	Slowest  map[string]int64  `json:"slowest"`  // the slowest reads (ms), for a report
}

// walk is a recursive grep (GNU grep -r: symlinks below the roots are not
// followed) for needles (hex-encoded, so the walker's own command line
// does not contain them) over roots, reading every regular file up to a
// cap, with a per-file timeout for files that block. -check PATH records
// how much of a masked file could be read.
func walk(args []string) (*walkResult, error) {
	var needles [][]byte
	var checks, roots []string
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "-hex":
			i++
			if i == len(args) {
				return nil, errors.New("-hex needs a value")
			}
			b, err := hex.DecodeString(args[i])
			if err != nil {
				return nil, err
			}
			needles = append(needles, b)
		case "-check":
			i++
			if i == len(args) {
				return nil, errors.New("-check needs a value")
			}
			checks = append(checks, args[i])
		default:
			roots = append(roots, args[i])
		}
	}
	const perFile = 256 << 10
	res := &walkResult{Matches: map[string]string{}, Checked: map[string]int64{}, Slowest: map[string]int64{}}
	for _, c := range checks {
		res.Checked[c] = -1
	}
	readOne := func(p string) ([]byte, bool) {
		type r struct{ b []byte }
		ch := make(chan r, 1)
		go func() {
			f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NONBLOCK, 0)
			if err != nil {
				ch <- r{}
				return
			}
			defer f.Close()
			b, _ := io.ReadAll(io.LimitReader(f, perFile))
			ch <- r{b}
		}()
		select {
		case v := <-ch:
			return v.b, true
		case <-time.After(2 * time.Second):
			return nil, false // a blocked read stays behind; the process exits soon
		}
	}
	for _, root := range roots {
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			// /proc/N/task/M mirrors /proc/N: reading it twice finds
			// nothing new and doubles the time.
			if d.IsDir() && d.Name() == "task" && strings.HasPrefix(p, "/proc/") {
				return filepath.SkipDir
			}
			if !d.Type().IsRegular() {
				return nil
			}
			start := time.Now()
			b, ok := readOne(p)
			if ms := time.Since(start).Milliseconds(); ms >= 100 && len(res.Slowest) < 50 {
				res.Slowest[p] = ms
			}
			if !ok {
				res.Timeouts = append(res.Timeouts, p)
				return nil
			}
			res.Files++
			res.Bytes += int64(len(b))
			if _, isCheck := res.Checked[p]; isCheck {
				res.Checked[p] = int64(len(b))
			}
			for _, n := range needles {
				if len(n) > 0 && bytesContains(b, n) {
					res.Matches[p] = string(n)
				}
			}
			return nil
		})
	}
	return res, nil
}

func bytesContains(b, sub []byte) bool { return strings.Contains(string(b), string(sub)) }

type readResult struct {
	Opened bool   `json:"opened"`
	N      int    `json:"n"`
	Err    string `json:"err"`
	Bytes  string `json:"bytes,omitempty"` // the first bytes, for a leak report
}

// readPaths opens and reads each path (up to 64 KiB), the way a curious
// agent would: readlink too, for /proc/N/exe and friends. An open or read
// that blocks (a console, a FIFO) is given up after two seconds.
func readPaths(paths []string) map[string]readResult {
	res := map[string]readResult{}
	for _, p := range paths {
		if target, err := os.Readlink(p); err == nil {
			res[p+"#readlink"] = readResult{N: len(target), Err: "ok", Bytes: target}
		} else {
			res[p+"#readlink"] = readResult{Err: errnoName(err)}
		}
		var mu sync.Mutex
		r := readResult{Err: "timeout"}
		done := make(chan struct{})
		go func() {
			defer close(done)
			f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NONBLOCK, 0)
			if err != nil {
				mu.Lock()
				r = readResult{Err: errnoName(err)}
				mu.Unlock()
				return
			}
			mu.Lock()
			r.Opened = true
			mu.Unlock()
			defer f.Close()
			b := make([]byte, 64<<10)
			n, err := io.ReadFull(f, b)
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
				err = nil
			}
			mu.Lock()
			r = readResult{Opened: true, N: n, Err: errnoName(err)}
			if n > 0 {
				r.Bytes = string(b[:min(n, 64)])
			}
			mu.Unlock()
		}()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
		}
		mu.Lock()
		res[p] = r
		mu.Unlock()
	}
	return res
}

// writePath writes data to path and reports the errno of open and write.
func writePath(args []string) (map[string]string, error) {
	if len(args) != 2 {
		return nil, errors.New("usage: write PATH DATA")
	}
	f, err := os.OpenFile(args[0], os.O_WRONLY, 0)
	if err != nil {
		return map[string]string{"open": errnoName(err)}, nil
	}
	defer f.Close()
	_, err = f.Write([]byte(args[1]))
	return map[string]string{"open": "ok", "write": errnoName(err)}, nil
}

// memhog allocates and touches memory 1 MiB at a time up to the given MiB,
// reporting progress on stderr, and prints how far it got.
func memhog(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: memhog MiB")
	}
	n, err := strconv.Atoi(args[0])
	if err != nil {
		return err
	}
	var hold [][]byte
	for i := 1; i <= n; i++ {
		b := make([]byte, 1<<20)
		for j := 0; j < len(b); j += 4096 {
			b[j] = byte(i)
		}
		hold = append(hold, b)
		if i%16 == 0 {
			fmt.Fprintf(os.Stderr, "held %d MiB\n", i)
		}
	}
	fmt.Printf("{\"held_mib\":%d}\n", len(hold))
	return nil
}
