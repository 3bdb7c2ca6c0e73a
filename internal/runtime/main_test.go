package runtime_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/runtime"
	"github.com/dsec-dev/dsec/internal/runtime/runtimetest"
	"github.com/dsec-dev/dsec/internal/testutil"
)

// lowerDir is a busybox rootfs built once for the package's tests.
var lowerDir string

func TestMain(m *testing.M) {
	code := func() int {
		// The helper server of TestAdoptAfterServerRestart is SIGKILLed and
		// gets its lower dir from the parent.
		if os.Geteuid() == 0 && os.Getenv("DSEC_HELPER_SERVER") == "" {
			dir, err := os.MkdirTemp("", "dsec-rt-lower-")
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer os.RemoveAll(dir)
			if err := runtimetest.BuildRootfs(dir); err != nil {
				fmt.Fprintln(os.Stderr, "build test rootfs:", err)
				return 1
			}
			lowerDir = dir
		}
		return m.Run()
	}()
	os.Exit(code)
}

type env struct {
	t      testing.TB
	rt     *runtime.NamespaceRuntime
	cg     cgroups.Manager
	parent string
	base   string
}

func newEnv(t testing.TB, opts ...runtime.Option) *env {
	t.Helper()
	testutil.RequiresRoot(t)
	rt, cg, parent := runtimetest.NewRuntime(t, opts...)
	// DSEC_TEST_DIR puts sandbox dirs on a chosen file system (benchmarks
	// on a VM's slow /tmp mostly measure its metadata latency).
	base, err := os.MkdirTemp(os.Getenv("DSEC_TEST_DIR"), "dsec-rt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	return &env{t: t, rt: rt, cg: cg, parent: parent, base: base}
}

func (e *env) spec(id string) runtime.Spec {
	return runtime.Spec{ID: id, Dir: filepath.Join(e.base, id), Lower: []string{lowerDir},
		Env: []string{"DSEC_TEST_DEFAULT=1"}, Resources: cgroups.Resources{PidsLimit: 256, MemoryLimit: 256 << 20}}
}

func (e *env) create(id string, mod ...func(*runtime.Spec)) *runtime.State {
	e.t.Helper()
	s := e.spec(id)
	for _, m := range mod {
		m(&s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := e.rt.Create(ctx, s)
	if err != nil {
		e.t.Fatalf("create %s: %v", id, err)
	}
	e.t.Cleanup(func() { _ = e.rt.Destroy(context.Background(), id) })
	return st
}

type result struct {
	*runtime.ExecResult
	stdout, stderr string
}

func (e *env) run(id string, p runtime.Process, stdin string) (*result, error) {
	var out, errb bytes.Buffer
	pio := runtime.IO{Stdout: &out, Stderr: &errb}
	if stdin != "" {
		pio.Stdin = strings.NewReader(stdin)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := runtime.Run(ctx, e.rt, id, p, pio)
	if err != nil {
		return nil, err
	}
	return &result{ExecResult: res, stdout: out.String(), stderr: errb.String()}, nil
}

func (e *env) sh(id, script string) *result {
	e.t.Helper()
	r, err := e.run(id, runtime.Process{Args: []string{"sh", "-c", script}}, "")
	if err != nil {
		e.t.Fatalf("exec %q: %v", script, err)
	}
	return r
}

func (e *env) mustSh(id, script string) string {
	e.t.Helper()
	r := e.sh(id, script)
	if r.ExitCode != 0 {
		e.t.Fatalf("exec %q: exit %d %s, stdout %q stderr %q", script, r.ExitCode, r.Signal, r.stdout, r.stderr)
	}
	return r.stdout
}
