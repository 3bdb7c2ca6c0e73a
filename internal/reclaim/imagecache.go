package reclaim

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Page cache is charged to the memory cgroup of the process that first
// reads a page (the owner of its mm; moving a thread does not help), and
// stays there until reclaimed. For image layers shared by many sandboxes
// that would bill whichever sandbox happened to read first, and make its
// reclaim evict pages others use. WarmFiles therefore reads layer files
// from a short-lived process placed in a node-level image-cache group: the
// pages land there, and sandboxes reading them later hit the cache without
// being charged.
//
// The reader is this same binary re-executed (/proc/self/exe) with
// warmEnv set; init below turns such a process into the reader before
// main runs, so every binary importing this package can warm.

const warmEnv = "DSEC_RECLAIM_WARM_READER"

func init() {
	if os.Getenv(warmEnv) == "1" {
		os.Exit(warmReader(os.Stdin, os.Stdout))
	}
}

// warmReader waits for "go", then reads each path given on the following
// lines and answers "ok BYTES" or "err MESSAGE" per path.
func warmReader(in io.Reader, out io.Writer) int {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	if !sc.Scan() || sc.Text() != "go" {
		return 2
	}
	buf := make([]byte, 256<<10)
	w := bufio.NewWriter(out)
	for sc.Scan() {
		n, err := readAll(sc.Text(), buf)
		if err != nil {
			fmt.Fprintf(w, "err %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		} else {
			fmt.Fprintf(w, "ok %d\n", n)
		}
		w.Flush()
	}
	return 0
}

func readAll(path string, buf []byte) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, buf)
}

// WarmResult counts what WarmFiles read.
type WarmResult struct {
	Files  int
	Bytes  int64
	Failed map[string]string // path -> error, for files that could not be read
}

// WarmFiles reads paths from a process in group g, so their page cache is
// charged to g. Paths are read through the path sandboxes use (a layer's
// lower directory, or its FUSE mount), since the cache belongs to that
// inode. Unreadable files are listed in Failed; only a failure to run the
// reader is an error.
func WarmFiles(ctx context.Context, g cgroups.Group, paths []string) (WarmResult, error) {
	res := WarmResult{Failed: map[string]string{}}
	for _, p := range paths {
		if p == "" || strings.ContainsRune(p, '\n') {
			return res, fmt.Errorf("reclaim: warm path %q: %w", p, errdefs.ErrInvalidArgument)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return res, fmt.Errorf("reclaim: warm: own executable: %w", err)
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), warmEnv+"=1")
	in, err := cmd.StdinPipe()
	if err != nil {
		return res, err
	}
	outR, err := cmd.StdoutPipe()
	if err != nil {
		return res, err
	}
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("reclaim: warm: start reader: %w", err)
	}
	defer func() {
		in.Close()
		_ = cmd.Wait()
	}()
	// The reader blocks on "go" until it sits in g, so nothing it reads
	// is charged elsewhere.
	if err := g.AddProc(cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		return res, fmt.Errorf("reclaim: warm: move reader into %s: %w", g.Name(), err)
	}
	if _, err := io.WriteString(in, "go\n"); err != nil {
		return res, fmt.Errorf("reclaim: warm: %w", err)
	}
	out := bufio.NewScanner(outR)
	for _, p := range paths {
		if _, err := io.WriteString(in, p+"\n"); err != nil {
			return res, fmt.Errorf("reclaim: warm: %w", err)
		}
		if !out.Scan() {
			if ctx.Err() != nil {
				return res, fmt.Errorf("reclaim: warm: %w: %w", ctx.Err(), errdefs.ErrDeadlineExceeded)
			}
			return res, fmt.Errorf("reclaim: warm: reader stopped: %w", errors.Join(out.Err(), io.ErrUnexpectedEOF))
		}
		status, rest, _ := strings.Cut(out.Text(), " ")
		switch status {
		case "ok":
			n, err := strconv.ParseInt(rest, 10, 64)
			if err != nil {
				return res, fmt.Errorf("reclaim: warm: reader said %q: %w", out.Text(), errdefs.ErrInvalidArgument)
			}
			res.Files++
			res.Bytes += n
		case "err":
			res.Failed[p] = rest
		default:
			return res, fmt.Errorf("reclaim: warm: reader said %q: %w", out.Text(), errdefs.ErrInvalidArgument)
		}
	}
	return res, nil
}
