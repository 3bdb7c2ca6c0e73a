// Package shim is the small C program that becomes a sandbox's PID 1 (init
// mode) or starts a process inside a sandbox (exec mode).
//
// It is compiled into the dsec binary with cgo and runs as an ELF
// constructor, i.e. before the Go runtime starts, when the process was
// exec'd with the environment variable _DSEC_SHIM set (the same trick as
// runc's nsexec). In that mode it never returns to Go, so an idle sandbox
// costs a few pages of libc state instead of a Go runtime (~0.8 MB), and an
// exec avoids the Go runtime's start-up (~8 ms on a small VM).
//
// Importing this package (the runtime package does) is what links the
// constructor into a binary; the binary can then start itself through
// /proc/self/exe.
//
// Parameters arrive on descriptor 3 as tagged, length-prefixed records
// (Config); the shim answers on descriptor 4 with one status line that
// ReadStatus decodes. Descriptor 5 is the init's sync pipe or, for an exec,
// a pidfd of the sandbox's init (setns on a pidfd joins all its namespaces
// at once and cannot hit a reused pid).
package shim
