package cgroups

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

type options struct {
	logger       *slog.Logger
	pollInterval time.Duration
	maxPoll      time.Duration
	// mkdir and rmdir are the only operations whose effect on cgroupfs
	// (the kernel populating or emptying a directory) a plain directory
	// cannot mimic; tests over fake trees replace them.
	mkdir func(dir string) error
	rmdir func(dir string) error
}

func defaultOptions() options {
	return options{
		logger:       slog.New(slog.DiscardHandler),
		pollInterval: 100 * time.Microsecond,
		maxPoll:      10 * time.Millisecond,
		mkdir:        func(dir string) error { return syscall.Mkdir(dir, 0o755) },
		rmdir:        syscall.Rmdir,
	}
}

func applyOptions(opts []Option) (options, error) {
	o := defaultOptions()
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	return o, nil
}

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return fmt.Errorf("cgroups: nil logger: %w", errdefs.ErrInvalidArgument)
		}
		o.logger = l
		return nil
	}
}

// WithPollInterval sets the first and the largest wait between two reads
// when waiting for the kernel (freeze settling, a group emptying). The wait
// doubles from first to max.
func WithPollInterval(first, max time.Duration) Option {
	return func(o *options) error {
		if first <= 0 || max < first {
			return fmt.Errorf("cgroups: poll interval %v..%v: %w", first, max, errdefs.ErrInvalidArgument)
		}
		o.pollInterval, o.maxPoll = first, max
		return nil
	}
}

// cleanName validates a group name: relative, slash separated, no "..".
func cleanName(name string) (string, error) {
	if name == "" || strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("cgroups: group name %q must be a non-empty relative path: %w", name, errdefs.ErrInvalidArgument)
	}
	for _, part := range strings.Split(name, "/") {
		if part == "" || part == "." || part == ".." {
			return "", fmt.Errorf("cgroups: group name %q has an empty, '.' or '..' element: %w", name, errdefs.ErrInvalidArgument)
		}
	}
	return path.Clean(name), nil
}

// classify wraps an OS error with the matching errdefs class.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
	case errors.Is(err, os.ErrExist):
		return fmt.Errorf("%w: %w", err, errdefs.ErrAlreadyExists)
	case errors.Is(err, os.ErrPermission):
		return fmt.Errorf("%w: %w", err, errdefs.ErrPermissionDenied)
	case errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ERANGE):
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	case errors.Is(err, syscall.EBUSY), errors.Is(err, syscall.EAGAIN):
		return fmt.Errorf("%w: %w", err, errdefs.ErrResourceExhausted)
	case errors.Is(err, syscall.EOPNOTSUPP):
		return fmt.Errorf("%w: %w", err, errdefs.ErrNotImplemented)
	}
	return err
}

// writeFile writes one value to an existing cgroup file. It never creates
// files: a missing file means a missing controller or feature, and that must
// surface as an error, not as a stray regular file in a fake tree.
func writeFile(dir, file, value string) error {
	f, err := os.OpenFile(filepath.Join(dir, file), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return fmt.Errorf("cgroups: open %s: %w", filepath.Join(dir, file), classify(err))
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("cgroups: write %q to %s: %w", value, filepath.Join(dir, file), classify(err))
	}
	return nil
}

func readFile(dir, file string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return nil, fmt.Errorf("cgroups: read %s: %w", filepath.Join(dir, file), classify(err))
	}
	return b, nil
}

func malformed(file string, line int, text string, why string) error {
	return fmt.Errorf("cgroups: malformed %s line %d %q: %s: %w", file, line, text, why, errdefs.ErrInvalidArgument)
}

// readUint reads a file holding one unsigned number, or "max" (returned as 0
// with max=true).
func readUint(dir, file string) (v uint64, max bool, err error) {
	b, err := readFile(dir, file)
	if err != nil {
		return 0, false, err
	}
	s := string(bytes.TrimSpace(b))
	if s == "max" {
		return 0, true, nil
	}
	v, err = strconv.ParseUint(s, 10, 64)
	if err != nil {
		// v1 limits may be written as -1 by others; they read back as a
		// large positive number, so a negative here is genuinely malformed.
		return 0, false, malformed(filepath.Join(dir, file), 1, s, "not an unsigned integer")
	}
	return v, false, nil
}

// parseKeyed parses "key value" lines (memory.stat, cpu.stat,
// memory.events, memory.oom_control, cgroup.events) calling fn per pair.
func parseKeyed(name string, b []byte, fn func(key string, v uint64)) error {
	for i, line := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return malformed(name, i+1, line, "want \"key value\"")
		}
		v, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			return malformed(name, i+1, line, "value is not an unsigned integer")
		}
		fn(fields[0], v)
	}
	return nil
}

func readKeyed(dir, file string) (map[string]uint64, error) {
	b, err := readFile(dir, file)
	if err != nil {
		return nil, err
	}
	m := make(map[string]uint64, 64)
	if err := parseKeyed(filepath.Join(dir, file), b, func(k string, v uint64) { m[k] = v }); err != nil {
		return nil, err
	}
	return m, nil
}

// ParsePressure parses a PSI file (/proc/pressure/* or a cgroup's
// *.pressure). A file with only a "some" line (cpu on older kernels) leaves
// Full zero.
func ParsePressure(name string, b []byte) (Pressure, error) {
	var p Pressure
	seen := false
	for i, line := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 5 {
			return p, malformed(name, i+1, line, "want \"some|full avg10= avg60= avg300= total=\"")
		}
		var dst *PSI
		switch fields[0] {
		case "some":
			dst = &p.Some
		case "full":
			dst = &p.Full
		default:
			return p, malformed(name, i+1, line, "first field must be some or full")
		}
		for _, kv := range fields[1:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return p, malformed(name, i+1, line, "field without '='")
			}
			var err error
			switch k {
			case "avg10":
				dst.Avg10, err = strconv.ParseFloat(v, 64)
			case "avg60":
				dst.Avg60, err = strconv.ParseFloat(v, 64)
			case "avg300":
				dst.Avg300, err = strconv.ParseFloat(v, 64)
			case "total":
				dst.TotalMicros, err = strconv.ParseUint(v, 10, 64)
			default:
				return p, malformed(name, i+1, line, "unknown field "+k)
			}
			if err != nil {
				return p, malformed(name, i+1, line, "bad number in "+k)
			}
		}
		seen = true
	}
	if !seen {
		return p, malformed(name, 0, "", "empty pressure file")
	}
	return p, nil
}

// ReadPressure reads a PSI file. It returns an error wrapping
// errdefs.ErrNotImplemented when the kernel runs without PSI (the file is
// missing, or reads fail with EOPNOTSUPP as with psi=0).
func ReadPressure(file string) (Pressure, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.EOPNOTSUPP) {
			return Pressure{}, fmt.Errorf("cgroups: PSI unavailable at %s: %w", file, errdefs.ErrNotImplemented)
		}
		return Pressure{}, fmt.Errorf("cgroups: read %s: %w", file, classify(err))
	}
	return ParsePressure(file, b)
}

// readProcs reads a cgroup.procs file.
func readProcs(dir string) ([]int, error) {
	b, err := readFile(dir, "cgroup.procs")
	if err != nil {
		return nil, err
	}
	var pids []int
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		pid, err := strconv.Atoi(line)
		if err != nil || pid <= 0 {
			return nil, malformed(filepath.Join(dir, "cgroup.procs"), i+1, line, "not a pid")
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// poller waits with doubling sleeps, bounded by ctx.
type poller struct {
	next, max time.Duration
}

func (o *options) poller() *poller { return &poller{next: o.pollInterval, max: o.maxPoll} }

func (p *poller) wait(ctx context.Context) error {
	t := time.NewTimer(p.next)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("cgroups: %w: %w", ctx.Err(), errdefs.ErrDeadlineExceeded)
	case <-t.C:
	}
	if p.next *= 2; p.next > p.max {
		p.next = p.max
	}
	return nil
}

// rmdirRetry removes a cgroup directory, retrying while the kernel still
// reports it busy (tasks that were just killed linger as zombies for a
// moment). A missing directory is not an error.
func rmdirRetry(ctx context.Context, o *options, dir string) error {
	p := o.poller()
	for {
		err := o.rmdir(dir)
		switch {
		case err == nil, errors.Is(err, syscall.ENOENT):
			return nil
		case errors.Is(err, syscall.EBUSY):
			if werr := p.wait(ctx); werr != nil {
				return fmt.Errorf("cgroups: rmdir %s still busy: %w", dir, werr)
			}
		default:
			return fmt.Errorf("cgroups: rmdir %s: %w", dir, classify(err))
		}
	}
}

func itoa(v int64) string  { return strconv.FormatInt(v, 10) }
func utoa(v uint64) string { return strconv.FormatUint(v, 10) }
func exists(p string) bool { _, err := os.Stat(p); return err == nil }
func isDir(p string) bool  { st, err := os.Stat(p); return err == nil && st.IsDir() }
func orMax(v int64) string {
	if v <= 0 {
		return "max"
	}
	return itoa(v)
}
func orNeg1(v int64) string {
	if v <= 0 {
		return "-1"
	}
	return itoa(v)
}
