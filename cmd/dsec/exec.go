package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/client"
)

func newExecCmd(a *app) *cobra.Command {
	var req client.ExecRequest
	var interactive, shell bool
	cmd := &cobra.Command{
		Use:   "exec ID [flags] -- CMD [ARGS...]",
		Short: "Run a command in a sandbox, streaming its output",
		Long: `Run a command in a sandbox. Output streams as it is produced; dsec exits
with the command's exit code (128+N if it was killed by signal N).

Use -i to stream this terminal's stdin to the command. With --shell the
words after -- are joined and run by /bin/sh -c. Ctrl-C sends SIGINT to
the command; a second Ctrl-C sends SIGKILL.`,
		Example: `  dsec exec sb-123 -- python -c 'print(1)'
  echo hi | dsec exec -i sb-123 -- cat
  dsec exec sb-123 --shell --timeout 30s -- 'pip install numpy && python t.py'`,
		Args: minArgs(2, "a sandbox ID and a command"),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.SandboxID = args[0]
			words := args[1:]
			if shell {
				req.Shell = strings.Join(words, " ")
			} else {
				req.Args = words
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			var stdin = a.stdin
			if !interactive {
				stdin = nil
			}
			code, err := runExec(cmd.Context(), c, req, stdin, a)
			if err != nil {
				return err
			}
			if code != 0 {
				return exitCode(code)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Cwd, "cwd", "", "working directory inside the sandbox")
	f.Var(envValue{&req.Env}, "env", "environment variable KEY=VALUE (repeatable)")
	f.StringVar(&req.User, "user", "", "user name or uid[:gid] (default root)")
	f.Var(durationValue{&req.Timeout}, "timeout", "kill the command after this long, e.g. 30s (0 = none)")
	f.Var(sizeValue{&req.OutputCap}, "output-cap", "bytes of stdout/stderr the server keeps for the exec record (0 = default)")
	f.StringVar(&req.Tag, "tag", "", "a label for the exec")
	f.BoolVarP(&interactive, "interactive", "i", false, "stream stdin to the command")
	f.BoolVar(&shell, "shell", false, "run the words after -- with /bin/sh -c")
	return cmd
}

// runExec streams one exec and returns the exit code the CLI should exit
// with. An interrupt is forwarded to the remote process rather than
// abandoning it.
func runExec(ctx context.Context, c *client.Client, req client.ExecRequest, stdin io.Reader, a *app) (int, error) {
	// The stream must outlive the first Ctrl-C (which only signals the
	// process), so it is not bound to the command's interruptible context.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	s, err := c.StartExec(sctx, req, stdin)
	if err != nil {
		return 0, err
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		n := 0
		for {
			select {
			case <-sigs:
			case <-sctx.Done():
				return
			}
			n++
			sig := int(syscall.SIGINT)
			if n > 1 {
				sig = int(syscall.SIGKILL)
			}
			tctx, tcancel := context.WithTimeout(sctx, 5*time.Second)
			if err := s.Signal(tctx, sig); err != nil {
				fmt.Fprintf(a.stderr, "dsec: signal exec %s: %s\n", s.ExecID, oneLine(err.Error()))
				if n > 2 {
					cancel() // give up on the stream
				}
			}
			tcancel()
		}
	}()
	res, err := s.Wait(a.stdout, a.stderr)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return 130, nil
		}
		return 0, err
	}
	if res.TimedOut {
		fmt.Fprintf(a.stderr, "dsec: command timed out after %s\n", req.Timeout)
	}
	if res.StdoutTruncated || res.StderrTruncated {
		fmt.Fprintf(a.stderr, "dsec: output was truncated by the server's output cap (%s)\n", formatSize(res.OutputCap))
	}
	return exitStatus(res), nil
}

// exitStatus maps a result to a shell-style exit code.
func exitStatus(res *client.ExecResult) int {
	if res.Signal != "" {
		if n := signalNumber(res.Signal); n > 0 {
			return 128 + n
		}
		if res.ExitCode > 0 {
			return res.ExitCode
		}
		return 128 + 9 // unknown signal name: report as killed
	}
	if res.ExitCode < 0 || res.ExitCode > 255 {
		return 255
	}
	return res.ExitCode
}

// signalNumber reads "SIGKILL", "KILL", "9" or Go's description ("killed").
func signalNumber(s string) int {
	s = strings.TrimSpace(s)
	if n, err := strconv.Atoi(s); err == nil {
		return n
	}
	up := strings.ToUpper(s)
	if !strings.HasPrefix(up, "SIG") {
		up = "SIG" + up
	}
	if n := unix.SignalNum(up); n != 0 {
		return int(n)
	}
	for i := 1; i < 65; i++ {
		if syscall.Signal(i).String() == s {
			return i
		}
	}
	return 0
}

func newSandboxExecsCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "execs ID",
		Short: "List a sandbox's execs: running ones and the ended ones its exec history keeps",
		Args:  exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			execs, err := c.ListExecs(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.stdout, execs)
			}
			now := time.Now()
			t := newTable(a.stdout, "EXEC", "STATE", "EXIT", "STARTED", "OUTPUT", "COMMAND")
			for _, e := range execs {
				state, exit, kept := "running", "-", "-"
				if r := e.Result; r != nil {
					state, exit, kept = "ended", strconv.Itoa(r.ExitCode), formatSize(r.OutputBytes)
					if r.Signal != "" {
						exit += " (" + r.Signal + ")"
					}
				} else if !e.Running {
					state = "lost"
				}
				command := e.Request.Shell
				if command == "" {
					command = strings.Join(e.Request.Args, " ")
				}
				t.row(e.ExecID, state, exit, age(e.StartedAt, now)+" ago", kept, command)
			}
			return t.flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newSandboxOutputCmd(a *app) *cobra.Command {
	var stderr bool
	cmd := &cobra.Command{
		Use:   "output ID EXEC_ID [--stderr]",
		Short: "Print the output the server kept of an exec (the tail, at most its output cap)",
		Args:  exactArgs(2, "a sandbox ID and an exec ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			stream := client.Stdout
			if stderr {
				stream = client.Stderr
			}
			rc, err := c.ExecOutput(cmd.Context(), args[0], args[1], stream)
			if err != nil {
				return err
			}
			defer rc.Close()
			_, err = io.Copy(a.stdout, rc)
			return err
		},
	}
	cmd.Flags().BoolVar(&stderr, "stderr", false, "print the kept stderr instead of stdout")
	return cmd
}
