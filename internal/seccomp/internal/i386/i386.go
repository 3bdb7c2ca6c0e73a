//go:build linux && amd64

// Package i386 makes a system call through the 32-bit ABI (int $0x80)
// from a 64-bit process. It exists so the seccomp tests can prove that
// the filter kills a process that switches ABI to reach syscalls under
// different numbers.
package i386

// Syscall3 issues int $0x80 with eax=trap and ebx, ecx, edx = a1, a2, a3
// and returns eax. It bypasses the Go scheduler's syscall bookkeeping, so
// use it only for calls that return at once (getpid).
func Syscall3(trap, a1, a2, a3 uintptr) uintptr
