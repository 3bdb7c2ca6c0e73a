package runtime

import (
	"encoding/binary"
	"unsafe"

	"golang.org/x/sys/unix"
)

var nativeEndian = binary.NativeEndian

func unsafePointer(info *unix.Siginfo) unsafe.Pointer { return unsafe.Pointer(info) }

// filterBytes is a seccomp program as the kernel's struct sock_filter[].
func filterBytes(f []unix.SockFilter) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), len(f)*int(unsafe.Sizeof(f[0])))
}
