//go:build linux

package seccomp

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Install sets no_new_privs and loads f for every thread of the calling
// process (SECCOMP_FILTER_FLAG_TSYNC, because Go may run the next syscall
// on any thread). It cannot be undone; it is meant for a process about to
// exec a sandbox payload, and for tests.
func (f Filter) Install() error {
	raw, err := f.MarshalBinary()
	if err != nil {
		return err
	}
	return installRaw(raw)
}

// installRaw loads a program from its MarshalBinary bytes, the way a C
// shim does, so tests exercise exactly what the shim receives.
func installRaw(raw []byte) error {
	if len(raw) == 0 || len(raw)%InstructionSize != 0 {
		return fmt.Errorf("seccomp: %d bytes is not a whole number of instructions", len(raw))
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("seccomp: set no_new_privs: %w", err)
	}
	prog := unix.SockFprog{
		Len:    uint16(len(raw) / InstructionSize),
		Filter: (*unix.SockFilter)(unsafe.Pointer(&raw[0])),
	}
	tid, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog)))
	runtime.KeepAlive(raw)
	if errno != 0 {
		return fmt.Errorf("seccomp: load filter: %w", errno)
	}
	if tid != 0 {
		// With TSYNC a positive return names a thread that could not be
		// synchronised; the filter was not loaded.
		return fmt.Errorf("seccomp: load filter: thread %d could not be synchronised", tid)
	}
	return nil
}
