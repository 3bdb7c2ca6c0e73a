package shim

// #cgo CFLAGS: -O2 -Wall -Wno-unused-result
import "C"

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// EnvVar selects the shim mode; its value is ModeInit, ModeExec or
// ModeSpawner.
const EnvVar = "_DSEC_SHIM"

const (
	ModeInit = "init"
	ModeExec = "exec"
	// ModeSpawner is a fork server: it starts inits and exec shims as
	// forks of itself on request (see spawner.c and the protocol below).
	ModeSpawner = "spawner"
)

// Spawner protocol (see shim.h). The spawner reads requests on
// FdSpawner, a SOCK_SEQPACKET socket. A request is SpawnRequestSize bytes
// (mode uint32, number of descriptors uint32, clone flags uint64, native
// byte order) with the descriptors the child gets as 0..n-1 attached
// (SCM_RIGHTS, at most SpawnMaxFDs). A reply is SpawnReplySize bytes (pid
// int32, errno int32) with the child's pidfd attached when pid > 0.
const (
	FdSpawner        = 3
	SpawnInit        = 1
	SpawnExec        = 2
	SpawnMaxFDs      = 6
	SpawnRequestSize = 16
	SpawnReplySize   = 8
)

// Descriptor numbers the shim expects (see shim.h).
const (
	FdConfig = 3
	FdStatus = 4
	FdAux    = 5 // init: sync pipe read end; exec: pidfd of the sandbox init
)

// Tag names one config record (see shim.h).
type Tag byte

const (
	THostname   Tag = 1
	TLower      Tag = 2
	TUpper      Tag = 3
	TWork       Tag = 4
	TRoot       Tag = 5
	TDiskDev    Tag = 6
	TDiskDir    Tag = 7
	TNetNS      Tag = 8
	TTmpSize    Tag = 9
	TShmSize    Tag = 10
	TSeccomp    Tag = 11
	TCaps       Tag = 12
	TExecID     Tag = 13
	TExecDir    Tag = 14
	TArg        Tag = 15
	TEnv        Tag = 16
	TCwd        Tag = 17
	TUser       Tag = 18
	TTimeoutMS  Tag = 19
	TOutCap     Tag = 20
	TCgroup     Tag = 21
	TDiskFSType Tag = 22
	TTTYRoot    Tag = 23 // exec: allocate a pty from <value>/dev/pts/ptmx
	TSysfs      Tag = 24 // init: bind this read-only sysfs mount instead of mounting one
	TRecord     Tag = 25 // exec: one line kept after the first of the result file
)

// Config is the shim's parameter block: records of tag, little-endian
// uint32 length, value and a NUL (so C can use values in place).
type Config struct {
	buf []byte
}

// Add appends one string record. Strings must not contain NUL bytes; the
// caller validates user input before it gets here.
func (c *Config) Add(t Tag, v string) {
	c.AddBytes(t, []byte(v))
}

// AddInt appends a decimal number.
func (c *Config) AddInt(t Tag, v int64) {
	c.Add(t, strconv.FormatInt(v, 10))
}

// AddBytes appends a binary record (such as a seccomp program).
func (c *Config) AddBytes(t Tag, v []byte) {
	c.buf = append(c.buf, byte(t))
	c.buf = binary.LittleEndian.AppendUint32(c.buf, uint32(len(v)))
	c.buf = append(c.buf, v...)
	c.buf = append(c.buf, 0)
}

// Bytes is the encoded block.
func (c *Config) Bytes() []byte { return c.buf }

// Error is a failure the shim reported on its status pipe.
type Error struct {
	Kind  string // invalid, noexec, notfound, exhausted, internal
	Errno int
	Msg   string
}

func (e *Error) Error() string {
	if e.Errno != 0 {
		return fmt.Sprintf("%s: errno %d", e.Msg, e.Errno)
	}
	return e.Msg
}

// Unwrap maps the shim's kind to an error class.
func (e *Error) Unwrap() error {
	switch e.Kind {
	case "invalid", "noexec":
		return errdefs.ErrInvalidArgument
	case "notfound":
		return errdefs.ErrNotFound
	case "exhausted":
		return errdefs.ErrResourceExhausted
	}
	return nil
}

// ReadStatus reads the shim's status line: "ok [value]" returns value;
// "err kind errno message" returns an *Error. EOF without a line means the
// shim died.
func ReadStatus(r io.Reader) (string, error) {
	line, err := bufio.NewReaderSize(r, 2048).ReadString('\n')
	if err != nil && line == "" {
		return "", fmt.Errorf("shim exited without status: %w", err)
	}
	line = strings.TrimSuffix(line, "\n")
	if v, ok := strings.CutPrefix(line, "ok"); ok {
		return strings.TrimSpace(v), nil
	}
	f := strings.SplitN(strings.TrimPrefix(line, "err "), " ", 3)
	if len(f) < 3 {
		return "", fmt.Errorf("shim: malformed status %q", line)
	}
	n, _ := strconv.Atoi(f[1])
	return "", &Error{Kind: f[0], Errno: n, Msg: f[2]}
}
