package main

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/client/clienttest"
)

func benchJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	out := ok(t, args...)
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("bench output is not one JSON object: %v\n%s", err, out)
	}
	return m
}

func TestBenchCreate(t *testing.T) {
	srv := startServer(t)
	srv.Service.CreateDelay = 5 * time.Millisecond
	m := benchJSON(t, "bench", "create", "--n", "6", "--parallel", "3", "--image", "base", "--json")
	for _, k := range []string{"n", "parallel", "p50_ms", "p90_ms", "p99_ms", "max_ms", "per_sec", "errors", "teardown_per_sec", "teardown_p50_ms"} {
		if _, ok := m[k]; !ok {
			t.Errorf("bench create JSON lacks %s: %v", k, m)
		}
	}
	if m["n"] != 6.0 || m["parallel"] != 3.0 || m["ok"] != 6.0 || m["errors"] != 0.0 || m["p50_ms"].(float64) < 5 || m["teardown_per_sec"].(float64) <= 0 {
		t.Fatalf("bench create: %v", m)
	}
	if srv.Service.Live() != 0 {
		t.Fatalf("%d sandboxes left", srv.Service.Live())
	}
	if out := ok(t, "bench", "create", "--n", "2", "--image", "base", "--keep"); !strings.Contains(out, "p50") {
		t.Fatalf("human output %q", out)
	}
	if srv.Service.Live() != 2 {
		t.Fatalf("--keep kept %d", srv.Service.Live())
	}
}

func TestBenchExec(t *testing.T) {
	srv := startServer(t)
	m := benchJSON(t, "bench", "exec", "--n", "8", "--parallel", "2", "--image", "base", "--json")
	if m["ok"] != 8.0 || m["errors"] != 0.0 || m["kind"] != "exec" || m["max_ms"].(float64) < m["p50_ms"].(float64) {
		t.Fatalf("bench exec: %v", m)
	}
	if srv.Service.Live() != 0 {
		t.Fatalf("%d sandboxes left", srv.Service.Live())
	}
}

func TestBenchDensity(t *testing.T) {
	srv := startServer(t)
	m := benchJSON(t, "bench", "density", "--n", "5", "--parallel", "2", "--image", "base", "--settle", "0s", "--json")
	// The fake node loses exactly MemPerSandbox of MemAvailable per sandbox.
	if m["host_bytes_per_sandbox"] != float64(clienttest.MemPerSandbox) || m["ok"] != 5.0 {
		t.Fatalf("bench density: %v", m)
	}
	if _, ok := m["create_per_sec_at_end"]; !ok {
		t.Fatalf("no create_per_sec_at_end: %v", m)
	}
	if srv.Service.Live() != 0 {
		t.Fatalf("%d sandboxes left", srv.Service.Live())
	}
	ok(t, "bench", "density", "--n", "3", "--image", "base", "--settle", "0s", "--keep")
	if srv.Service.Live() != 3 {
		t.Fatalf("--keep kept %d", srv.Service.Live())
	}
}

// TestBenchCleansUpOnErrors runs into a tenant quota half way: the
// failures are counted and every sandbox that was created is deleted.
func TestBenchCleansUpOnErrors(t *testing.T) {
	srv := clienttest.NewServer(t, clienttest.ServerOptions{Images: []string{"base"}})
	admin, err := client.New(srv.Addr, client.WithToken(srv.Service.AdminToken()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateTenant(t.Context(), client.Tenant{Name: "small", Quota: client.Quota{Sandboxes: 3}}); err != nil {
		t.Fatal(err)
	}
	tok, err := admin.CreateToken(t.Context(), "small", client.TokenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("DSEC_ADDR", srv.Addr)
	t.Setenv("DSEC_TOKEN", tok.Secret)
	out, errOut, code := cli(t, "", "bench", "create", "--n", "6", "--parallel", "1", "--image", "base", "--keep=false", "--json")
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil || code != 0 {
		t.Fatalf("exit %d out %q err %q", code, out, errOut)
	}
	if m["ok"] != 3.0 || m["errors"] != 3.0 || !strings.Contains(m["first_error"].(string), "quota") {
		t.Fatalf("bench with quota: %v", m)
	}
	if srv.Service.Live() != 0 {
		t.Fatalf("%d sandboxes left", srv.Service.Live())
	}
	// Every operation failing is an error exit.
	t.Setenv("DSEC_TOKEN", "wrong")
	if _, errOut, code := cli(t, "", "bench", "exec", "--n", "2", "--image", "base"); code != 1 || !strings.Contains(errOut, "unknown or revoked token") {
		t.Fatalf("bad token: %d %q", code, errOut)
	}
}

// TestBenchCleansUpOnInterrupt cancels the command's context (what Ctrl-C
// does) while creations are in flight.
func TestBenchCleansUpOnInterrupt(t *testing.T) {
	srv := startServer(t)
	srv.Service.CreateDelay = 30 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	a := &app{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard}
	root := newRootCmd(a)
	root.SetArgs([]string{"bench", "density", "--n", "200", "--parallel", "4", "--image", "base", "--settle", "0s"})
	root.SetOut(io.Discard)
	root.SetErr(io.Discard)
	time.AfterFunc(200*time.Millisecond, cancel)
	err := root.ExecuteContext(ctx)
	if err == nil || !strings.Contains(err.Error(), "interrupted") {
		t.Fatalf("interrupted bench returned %v", err)
	}
	if n := srv.Service.Live(); n != 0 {
		t.Fatalf("%d sandboxes left after interrupt", n)
	}
}
