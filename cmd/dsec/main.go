// Command dsec is the dsec server and its command-line client. Every
// client command is a thin caller of the Go SDK (package client); the
// server is started with `dsec serve`.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/client"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// app is what commands share: the streams (swapped in tests) and how to
// reach the server.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	addr           string // --addr; "" = $DSEC_ADDR, then the default socket
	// tty reports whether stderr is a terminal (progress display).
	tty bool
}

func (a *app) client() (*client.Client, error) {
	return client.New(a.addr, client.WithUserAgent("dsec-cli"))
}

// usageError is a mistake in how the command was called (exit 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// exitCode carries an exec'd command's exit status out of the CLI.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// run executes the CLI and returns the process exit code.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr, tty: isTerminal(stderr)}
	root := newRootCmd(a)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ec exitCode
	if errors.As(err, &ec) {
		return int(ec)
	}
	fmt.Fprintf(stderr, "dsec: %s\n", oneLine(err.Error()))
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func newRootCmd(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:   "dsec",
		Short: "Sandboxes for AI-agent rollouts",
		Long: `dsec runs isolated sandboxes for AI-agent RL rollouts.

The client commands find the server through DSEC_ADDR (default
unix:///run/dsec/dsec.sock; tcp://host:port for a remote server) and
authenticate with DSEC_TOKEN on TCP.`,
		SilenceUsage:      true,
		SilenceErrors:     true,
		Args:              noArgs,
		RunE:              func(cmd *cobra.Command, _ []string) error { return helpUsage(cmd) },
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: true},
	}
	root.PersistentFlags().StringVar(&a.addr, "addr", "", "server address (default $DSEC_ADDR or "+client.DefaultAddr+")")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(
		newServeCmd(),
		newImageCmd(a),
		newSandboxCmd(a),
		newExecCmd(a),
		newFileCmd(a),
		newTenantCmd(a),
		newTokenCmd(a),
		newNodeCmd(a),
		newTopCmd(a),
		newBenchCmd(a),
	)
	for _, f := range extraCommands {
		root.AddCommand(f())
	}
	return root
}

// extraCommands are commands other files add from init() with
// registerCommand (server-side helpers such as hidden daemons), so this
// file need not know them.
var extraCommands []func() *cobra.Command

func registerCommand(f func() *cobra.Command) { extraCommands = append(extraCommands, f) }

// group returns a command that only holds subcommands: run bare, it prints
// help and fails as a usage error; with an unknown word it says so.
func group(use, short string, aliases ...string) *cobra.Command {
	return &cobra.Command{
		Use:     use,
		Short:   short,
		Aliases: aliases,
		Args:    noArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return helpUsage(cmd) },
	}
}

func helpUsage(cmd *cobra.Command) error {
	_ = cmd.Help()
	return usagef("%s needs a subcommand", cmd.CommandPath())
}

// Argument validators that fail as usage errors.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		if cmd.HasSubCommands() {
			return usagef("unknown command %q for %q (see %s --help)", args[0], cmd.CommandPath(), cmd.CommandPath())
		}
		return usagef("%s takes no arguments, got %q", cmd.CommandPath(), args[0])
	}
	return nil
}

func exactArgs(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s needs %s, got %d argument(s)", cmd.CommandPath(), names, len(args))
		}
		return nil
	}
}

func minArgs(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < n {
			return usagef("%s needs %s", cmd.CommandPath(), names)
		}
		return nil
	}
}
