//go:build linux

package seccomp

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// Options relax the default profile. The zero value is the strictest
// profile and what sandboxes get unless their spec asks otherwise.
type Options struct {
	// AllowUserNS lets processes create user namespaces: clone and unshare
	// with CLONE_NEWUSER are allowed and clone3 is no longer answered with
	// ENOSYS.
	AllowUserNS bool
	// AllowPtrace allows ptrace, process_vm_readv and process_vm_writev
	// (debuggers, strace, py-spy).
	AllowPtrace bool
	// AllowUserfaultfd allows userfaultfd(2) (CRIU, some GC runtimes).
	AllowUserfaultfd bool
}

// Filter is a classic BPF program for seccomp(SECCOMP_SET_MODE_FILTER).
type Filter []unix.SockFilter

// InstructionSize is the size of one struct sock_filter.
const InstructionSize = 8

// MarshalBinary returns the program as the kernel's struct sock_filter
// array: 8 bytes per instruction, little endian (u16 code, u8 jt, u8 jf,
// u32 k). A C shim can point sock_fprog.filter at it unchanged.
func (f Filter) MarshalBinary() ([]byte, error) {
	if len(f) == 0 || len(f) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("seccomp: program of %d instructions is outside 1..%d", len(f), unix.BPF_MAXINSNS)
	}
	b := make([]byte, 0, len(f)*InstructionSize)
	for _, in := range f {
		b = binary.LittleEndian.AppendUint16(b, in.Code)
		b = append(b, in.Jt, in.Jf)
		b = binary.LittleEndian.AppendUint32(b, in.K)
	}
	return b, nil
}

// UnmarshalBinary parses the format written by MarshalBinary.
func (f *Filter) UnmarshalBinary(b []byte) error {
	if len(b) == 0 || len(b)%InstructionSize != 0 {
		return fmt.Errorf("seccomp: %d bytes is not a whole number of %d-byte instructions", len(b), InstructionSize)
	}
	out := make(Filter, len(b)/InstructionSize)
	for i := range out {
		p := b[i*InstructionSize:]
		out[i] = unix.SockFilter{
			Code: binary.LittleEndian.Uint16(p),
			Jt:   p[2],
			Jf:   p[3],
			K:    binary.LittleEndian.Uint32(p[4:]),
		}
	}
	*f = out
	return nil
}

// Offsets into struct seccomp_data (include/uapi/linux/seccomp.h).
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// x32SyscallBit marks x32-ABI syscall numbers (arch/x86/include/uapi/asm/unistd.h).
// x32 shares AUDIT_ARCH_X86_64, so only this bit tells it apart.
const x32SyscallBit = 0x40000000

const retAllow = unix.SECCOMP_RET_ALLOW

func retErrno(e unix.Errno) uint32 {
	return unix.SECCOMP_RET_ERRNO | (uint32(e) & unix.SECCOMP_RET_DATA)
}

type op uint8

const (
	opEqual   op = iota // low 32 bits of the argument == value
	opAnyBits           // low 32 bits of the argument & value != 0
)

// argCase is one test on a syscall argument and the action when it holds.
type argCase struct {
	op     op
	value  uint32
	action uint32
}

// rule is what the profile does with one syscall. Without cases the
// syscall always gets action. With cases, the low 32 bits of argument
// arg are tested in order, the first case that holds decides, and
// otherwise applies when none does.
type rule struct {
	name      string
	nr        uint32
	action    uint32
	arg       int
	cases     []argCase
	otherwise uint32
}

// build assembles rules into a program: arch check, x32 check, then one
// self-contained block per rule, so every jump is short and forward.
func build(arch uint32, rules []rule) (Filter, error) {
	f := Filter{
		stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArch),
		jump(unix.BPF_JEQ, arch, 1, 0),
		stmt(unix.BPF_RET|unix.BPF_K, unix.SECCOMP_RET_KILL_PROCESS),
		stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offNr),
		// x32 numbers are >= x32SyscallBit. -1 is let through: the kernel
		// answers ENOSYS and ptracers use it to skip a syscall.
		jump(unix.BPF_JGE, x32SyscallBit, 0, 3),
		jump(unix.BPF_JEQ, 0xffffffff, 1, 0),
		stmt(unix.BPF_RET|unix.BPF_K, unix.SECCOMP_RET_KILL_PROCESS),
		stmt(unix.BPF_RET|unix.BPF_K, retErrno(unix.ENOSYS)),
	}
	seen := make(map[uint32]string, len(rules))
	for _, r := range rules {
		if prev, dup := seen[r.nr]; dup {
			return nil, fmt.Errorf("seccomp: syscall %d has two rules (%s, %s)", r.nr, prev, r.name)
		}
		seen[r.nr] = r.name
		if len(r.cases) == 0 {
			f = append(f,
				jump(unix.BPF_JEQ, r.nr, 0, 1),
				stmt(unix.BPF_RET|unix.BPF_K, r.action))
			continue
		}
		if r.arg < 0 || r.arg > 5 {
			return nil, fmt.Errorf("seccomp: rule %s tests argument %d", r.name, r.arg)
		}
		n := 1 + 2*len(r.cases) + 1 // load, (test, ret) per case, ret otherwise
		if n > 255 {
			return nil, fmt.Errorf("seccomp: rule %s has too many cases", r.name)
		}
		// Only the low 32 bits are compared: the syscalls filtered on
		// arguments (clone flags, unshare flags, ioctl cmd, personality)
		// take 32-bit values and the kernel ignores the upper half, so a
		// 64-bit comparison could be bypassed by setting high bits
		// (CVE-2019-10063 in flatpak's TIOCSTI filter).
		f = append(f,
			jump(unix.BPF_JEQ, r.nr, 0, uint8(n)),
			stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, uint32(offArgs+8*r.arg)))
		for _, c := range r.cases {
			switch c.op {
			case opEqual:
				f = append(f, jump(unix.BPF_JEQ, c.value, 0, 1))
			case opAnyBits:
				f = append(f, jump(unix.BPF_JSET, c.value, 0, 1))
			default:
				return nil, fmt.Errorf("seccomp: rule %s: unknown op %d", r.name, c.op)
			}
			f = append(f, stmt(unix.BPF_RET|unix.BPF_K, c.action))
		}
		f = append(f, stmt(unix.BPF_RET|unix.BPF_K, r.otherwise))
	}
	f = append(f, stmt(unix.BPF_RET|unix.BPF_K, retAllow))
	if len(f) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("seccomp: program has %d instructions, limit %d", len(f), unix.BPF_MAXINSNS)
	}
	return f, nil
}

func stmt(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }

func jump(cond uint16, k uint32, jt, jf uint8) unix.SockFilter {
	return unix.SockFilter{Code: unix.BPF_JMP | cond | unix.BPF_K, Jt: jt, Jf: jf, K: k}
}
