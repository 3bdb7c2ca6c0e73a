package e2b

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/testutil"
)

const template = "e2btest"

// TestSDKAcceptance runs sdk_test.mjs, unmodified e2b SDK calls only,
// against a real server, then checks that the sandboxes it made left
// nothing behind: no sandbox record, no cgroup, no mount.
func TestSDKAcceptance(t *testing.T) {
	s := startServer(t)
	s.importImage(template)
	key := s.e2bKey("sdk")

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	stdout, stderr, err := s.runNode(ctx, key, "sdk_test.mjs")
	t.Logf("sdk script steps:\n%s", stderr)
	var res struct {
		OK        bool     `json:"ok"`
		Sandboxes []string `json:"sandboxes"`
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if jerr := json.Unmarshal([]byte(lines[len(lines)-1]), &res); jerr != nil {
		t.Fatalf("sdk script printed no result (%v): %v\nstdout: %s\nstderr: %s", err, jerr, stdout, stderr)
	}
	if err != nil || !res.OK {
		t.Fatalf("sdk script failed: %v", err)
	}
	if len(res.Sandboxes) != 3 {
		t.Fatalf("the script made %d sandboxes, want 3: %v", len(res.Sandboxes), res.Sandboxes)
	}

	// Nothing left: the server lists no sandbox (the admin sees all).
	out := s.mustCLI("sandbox", "ls", "--json")
	var sbs []struct{ ID, State string }
	if err := json.Unmarshal([]byte(out), &sbs); err != nil {
		t.Fatalf("sandbox ls --json: %v: %q", err, out)
	}
	if len(sbs) != 0 {
		t.Errorf("sandboxes left after the SDK killed them: %+v", sbs)
	}
	// No cgroup of theirs in any controller.
	if left := cgroupsOf(res.Sandboxes); len(left) > 0 {
		t.Errorf("cgroups left: %v", left)
	}
	// No host link of theirs (the network sandbox had a veth, named by
	// its alias).
	if out, err := exec.Command("ip", "-o", "link", "show").CombinedOutput(); err != nil {
		t.Errorf("ip link: %v: %s", err, out)
	} else {
		for _, id := range res.Sandboxes {
			if strings.Contains(string(out), id) {
				t.Errorf("host link of sandbox %s left:\n%s", id, out)
			}
		}
	}
	// No mount below the server's directory but the layer daemon's own
	// (stopped in cleanup, which checks again).
	for _, m := range mountsBelow(s.dir) {
		for _, id := range res.Sandboxes {
			if strings.Contains(m, id) {
				t.Errorf("mount of sandbox %s left: %s", id, m)
			}
		}
	}
}

// TestServeRejectsBadE2BListen: the E2B listener is TCP only, and a bad
// address fails the start with a clear error instead of being ignored.
func TestServeRejectsBadE2BListen(t *testing.T) {
	testutil.RequiresRoot(t)
	for _, addr := range []string{"unix:///tmp/x.sock", "127.0.0.1:1", "tcp://no-port"} {
		dir := t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		cmd := exec.CommandContext(ctx, dsecBin, "serve", "--data-dir", filepath.Join(dir, "data"),
			"--listen", "unix://"+filepath.Join(dir, "dsec.sock"), "--e2b-listen", addr)
		out, err := cmd.CombinedOutput()
		timedOut := ctx.Err() != nil
		cancel()
		_ = exec.Command(dsecBin, "layerd-stop", "--data-dir", filepath.Join(dir, "data")).Run()
		if timedOut {
			t.Errorf("--e2b-listen %q: serve kept running instead of failing", addr)
			continue
		}
		if err == nil {
			t.Errorf("--e2b-listen %q: serve exited 0", addr)
			continue
		}
		if !strings.Contains(string(out), "e2b-listen") {
			t.Errorf("--e2b-listen %q: the error does not name the flag:\n%s", addr, out)
		}
		for _, m := range mountsBelow(dir) {
			t.Errorf("left mounted: %s", m)
		}
	}
}
