//go:build linux && amd64

package seccomp

import (
	"encoding/binary"
	"os"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestMarshalBinary(t *testing.T) {
	f, err := DefaultFilter(Options{})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := f.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) != len(f)*InstructionSize {
		t.Fatalf("got %d bytes for %d instructions", len(raw), len(f))
	}
	// Byte-for-byte what the kernel reads from a struct sock_filter array
	// on this (little-endian) machine.
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), len(f)*int(unsafe.Sizeof(f[0])))
	if string(mem) != string(raw) {
		t.Fatal("serialised bytes differ from the in-memory struct sock_filter array")
	}
	first := raw[:8]
	if code := binary.LittleEndian.Uint16(first); code != unix.BPF_LD|unix.BPF_W|unix.BPF_ABS {
		t.Fatalf("first instruction code %#x, want ld [arch]", code)
	}
	if k := binary.LittleEndian.Uint32(first[4:]); k != offArch {
		t.Fatalf("first instruction k %d, want %d", k, offArch)
	}
	var back Filter
	if err := back.UnmarshalBinary(raw); err != nil {
		t.Fatal(err)
	}
	if len(back) != len(f) {
		t.Fatalf("round trip: %d instructions, want %d", len(back), len(f))
	}
	for i := range f {
		if back[i] != f[i] {
			t.Fatalf("round trip: instruction %d is %+v, want %+v", i, back[i], f[i])
		}
	}
}

func TestBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func() error
	}{
		{"empty filter", func() error { _, err := Filter(nil).MarshalBinary(); return err }},
		{"too long", func() error { _, err := make(Filter, unix.BPF_MAXINSNS+1).MarshalBinary(); return err }},
		{"ragged bytes", func() error { var f Filter; return f.UnmarshalBinary(make([]byte, 12)) }},
		{"no bytes", func() error { var f Filter; return f.UnmarshalBinary(nil) }},
		{"duplicate rule", func() error {
			_, err := build(unix.AUDIT_ARCH_X86_64, []rule{
				{name: "a", nr: 1, action: retAllow}, {name: "b", nr: 1, action: retAllow}})
			return err
		}},
		{"argument out of range", func() error {
			_, err := build(unix.AUDIT_ARCH_X86_64, []rule{
				{name: "a", nr: 1, arg: 6, cases: []argCase{{opEqual, 1, retAllow}}}})
			return err
		}},
		{"install nothing", func() error { return installRaw(nil) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.run(); err == nil {
				t.Fatal("no error")
			}
		})
	}
}

// TestRulesDocumented keeps the table in doc.go in step with the rules.
func TestRulesDocumented(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules(Options{}, unix.EPERM) {
		if !strings.Contains(string(doc), "| "+r.name+" ") {
			t.Errorf("rule %q is missing from the table in doc.go", r.name)
		}
	}
}

// TestArchCheck runs the program in a small classic-BPF interpreter for
// inputs a live test cannot easily produce on every kernel.
func TestArchCheck(t *testing.T) {
	f, err := DefaultFilter(Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		arch uint32
		nr   uint32
		want uint32
	}{
		{"x86_64 getpid", unix.AUDIT_ARCH_X86_64, unix.SYS_GETPID, unix.SECCOMP_RET_ALLOW},
		{"x86_64 mount", unix.AUDIT_ARCH_X86_64, unix.SYS_MOUNT, retErrno(unix.EPERM)},
		{"i386 getpid", unix.AUDIT_ARCH_I386, 20, unix.SECCOMP_RET_KILL_PROCESS},
		{"i386 read (0 on x86_64)", unix.AUDIT_ARCH_I386, 3, unix.SECCOMP_RET_KILL_PROCESS},
		{"x32 mount", unix.AUDIT_ARCH_X86_64, x32SyscallBit | unix.SYS_MOUNT, unix.SECCOMP_RET_KILL_PROCESS},
		{"aarch64 anything", unix.AUDIT_ARCH_AARCH64, 0, unix.SECCOMP_RET_KILL_PROCESS},
		{"nr -1", unix.AUDIT_ARCH_X86_64, 0xffffffff, retErrno(unix.ENOSYS)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := interpret(t, f, tc.arch, tc.nr, [6]uint64{}); got != tc.want {
				t.Fatalf("got %#x, want %#x", got, tc.want)
			}
		})
	}
}

// interpret evaluates the subset of classic BPF that build emits.
func interpret(t *testing.T, f Filter, arch, nr uint32, args [6]uint64) uint32 {
	t.Helper()
	var data [64]byte
	binary.LittleEndian.PutUint32(data[offNr:], nr)
	binary.LittleEndian.PutUint32(data[offArch:], arch)
	for i, a := range args {
		binary.LittleEndian.PutUint64(data[offArgs+8*i:], a)
	}
	var acc uint32
	for pc := 0; pc < len(f); pc++ {
		in := f[pc]
		switch in.Code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			acc = binary.LittleEndian.Uint32(data[in.K:])
		case unix.BPF_RET | unix.BPF_K:
			return in.K
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K:
			pc += int(pick(acc == in.K, in.Jt, in.Jf))
		case unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K:
			pc += int(pick(acc >= in.K, in.Jt, in.Jf))
		case unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K:
			pc += int(pick(acc&in.K != 0, in.Jt, in.Jf))
		default:
			t.Fatalf("instruction %d: unexpected code %#x", pc, in.Code)
		}
	}
	t.Fatal("program fell off the end")
	return 0
}

func pick(c bool, a, b uint8) uint8 {
	if c {
		return a
	}
	return b
}

func BenchmarkDefaultFilter(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DefaultFilter(Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
