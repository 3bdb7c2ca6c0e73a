package misconduct

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/testutil"
	"github.com/dsec-dev/dsec/test/testenv"
)

const (
	image      = "misconduct:1"
	attackPath = "/usr/local/bin/attack"
	// canary is what the bystander sandbox holds; an attack that reaches
	// it (or the host) shows here.
	canary = "bystander canary\n"
)

// suite is the state shared by every test.
var suite struct {
	srv       *testenv.Server
	attack    string // the attack tool on the host
	rootfs    string // the image's rootfs as imported
	bystander string // a sandbox that must keep working through every attack
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		return m.Run() // every test calls testutil.RequiresRoot
	}
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "misconduct:", err)
		return 1
	}
	bin, cleanup, err := testenv.Build()
	if err != nil {
		return fail(err)
	}
	defer cleanup()
	suite.attack = filepath.Join(filepath.Dir(bin), "attack")
	if err := testenv.GoBuild(suite.attack, "./test/misconduct/attack", []string{"CGO_ENABLED=0"}); err != nil {
		return fail(err)
	}
	cfg := filepath.Join(filepath.Dir(bin), "config.json")
	// A subnet of its own, so the suite does not collide with another
	// dsec on this host.
	if err := os.WriteFile(cfg, []byte(`{"network":{"subnet":"10.219.0.0/16"}}`), 0o600); err != nil {
		return fail(err)
	}
	srv, err := testenv.New(bin, testenv.WithTCP(), testenv.WithArgs("--config", cfg))
	if err != nil {
		return fail(err)
	}
	suite.srv = srv
	defer func() {
		if err := srv.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "misconduct:", err)
		}
	}()
	err = srv.ImportImage(image, func(dir string) error {
		suite.rootfs = dir
		return nil
	}, "--public")
	if err != nil {
		return fail(err)
	}
	c, err := srv.NewClient()
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	by, err := c.CreateSandbox(ctx, client.SandboxSpec{Image: image, MemoryBytes: 64 << 20, Pids: 64,
		Labels: map[string]string{"role": "bystander"}})
	if err != nil {
		return fail(err)
	}
	suite.bystander = by.ID
	if _, err := c.WriteFile(ctx, by.ID, "/workspace/canary", 0o644, strings.NewReader(canary)); err != nil {
		return fail(err)
	}
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "server log (tail):\n%s\n", srv.Log())
	}
	return code
}

// admin is the suite's admin client (unix socket).
func admin(t *testing.T) *client.Client {
	t.Helper()
	testutil.RequiresRoot(t)
	return suite.srv.Client(t)
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// newSandbox creates a sandbox of the suite's image (spec.Image may
// override) and deletes it when the test ends.
func newSandbox(t *testing.T, spec client.SandboxSpec) string {
	t.Helper()
	c := admin(t)
	if spec.Image == "" {
		spec.Image = image
	}
	sb, err := c.CreateSandbox(ctxT(t, time.Minute), spec)
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil && !client.IsNotFound(err) {
			t.Errorf("delete %s: %v", sb.ID, err)
		}
	})
	return sb.ID
}

// result is one finished exec.
type result struct {
	stdout, stderr string
	*client.ExecResult
}

// execIn runs req in sandbox id and waits for it.
func execIn(t *testing.T, id string, req client.ExecRequest) result {
	t.Helper()
	req.SandboxID = id
	if req.Timeout == 0 {
		req.Timeout = time.Minute
	}
	var o, e bytes.Buffer
	res, err := admin(t).Exec(ctxT(t, req.Timeout+30*time.Second), req, nil, &o, &e)
	if err != nil {
		t.Fatalf("exec %v %q in %s: %v (stderr %q)", req.Args, req.Shell, id, err, e.String())
	}
	return result{o.String(), e.String(), res}
}

// sh runs a shell script as root and returns its stdout; a non-zero exit
// fails the test.
func sh(t *testing.T, id, script string) string {
	t.Helper()
	r := execIn(t, id, client.ExecRequest{Shell: script})
	if r.ExitCode != 0 {
		t.Fatalf("%q in %s: exit %d, stderr %q", script, id, r.ExitCode, r.stderr)
	}
	return r.stdout
}

// putAttack copies the attack tool into the sandbox with the CLI.
func putAttack(t *testing.T, id string) {
	t.Helper()
	suite.srv.MustCLI(t, "file", "put", "--mode", "0755", id, suite.attack, attackPath)
}

// attack runs the tool (as user when not empty) and decodes its JSON.
func attack(t *testing.T, id, user string, out any, args ...string) {
	t.Helper()
	r := execIn(t, id, client.ExecRequest{Args: append([]string{attackPath}, args...), User: user, Timeout: 2 * time.Minute})
	if r.ExitCode != 0 {
		t.Fatalf("attack %v: exit %d (%s), stderr %q", args, r.ExitCode, r.Signal, r.stderr)
	}
	if err := json.Unmarshal([]byte(r.stdout), out); err != nil {
		t.Fatalf("attack %v: %v: %q", args, err, r.stdout)
	}
}

// assertHealthy checks what every attack must leave intact: the server
// answers, the bystander sandbox runs commands, keeps its files and takes
// new ones.
func assertHealthy(t *testing.T) {
	t.Helper()
	if err := checkHealthy(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
}

func checkHealthy(ctx context.Context) error {
	c, err := suite.srv.NewClient()
	if err != nil {
		return err
	}
	if err := c.Health(ctx); err != nil {
		return fmt.Errorf("server unhealthy: %w", err)
	}
	var o, e bytes.Buffer
	res, err := c.Exec(ctx, client.ExecRequest{SandboxID: suite.bystander, Args: []string{"cat", "/workspace/canary"}}, nil, &o, &e)
	if err != nil {
		return fmt.Errorf("bystander exec: %w", err)
	}
	if res.ExitCode != 0 || o.String() != canary {
		return fmt.Errorf("bystander: exit %d, canary %q, stderr %q", res.ExitCode, o.String(), e.String())
	}
	if _, err := c.WriteFile(ctx, suite.bystander, "/workspace/alive", 0o644, strings.NewReader("alive")); err != nil {
		return fmt.Errorf("bystander write: %w", err)
	}
	return nil
}

// duringAttack runs attack while checking, every 250ms, that the server
// and the bystander stay healthy; then checks once more. The checker stops
// also when attack fails the test.
func duringAttack(t *testing.T, attack func()) {
	t.Helper()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	checks := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			err := checkHealthy(ctx)
			cancel()
			mu.Lock()
			checks++
			if err != nil {
				failures = append(failures, err.Error())
			}
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	func() {
		defer func() {
			close(stop)
			wg.Wait()
		}()
		attack()
	}()
	if len(failures) > 0 {
		t.Errorf("during the attack (%d checks): %s", checks, strings.Join(failures, "; "))
	}
	assertHealthy(t)
}
