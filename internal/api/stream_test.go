package api

import (
	"bufio"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/node"
	rt "github.com/dsec-dev/dsec/internal/runtime"
)

type execReply struct {
	status         int
	execID         string
	stdout, stderr string
	result         *rt.ExecResult
	errFrame       string
	frames         int
}

// doExec runs an exec over HTTP with stdin sent at once.
func (e *env) doExec(token, id string, req node.ExecRequest, stdin string) execReply {
	e.t.Helper()
	line, _ := json.Marshal(req)
	r, err := http.NewRequest("POST", e.srv.URL+"/v1/sandboxes/"+id+"/exec", strings.NewReader(string(line)+"\n"+stdin))
	if err != nil {
		e.t.Fatal(err)
	}
	r.Header.Set("Authorization", "Bearer "+token)
	resp, err := e.srv.Client().Do(r)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	out := execReply{status: resp.StatusCode}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		out.errFrame = string(b)
		return out
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		e.t.Fatalf("content type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var f ExecFrame
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			e.t.Fatalf("frame %q: %v", sc.Text(), err)
		}
		out.frames++
		switch {
		case out.frames == 1:
			if f.ExecID == "" || f.Pid == 0 {
				e.t.Fatalf("first frame is not the exec header: %s", sc.Text())
			}
			out.execID = f.ExecID
		case f.Stream == "stdout":
			out.stdout += string(f.Data)
		case f.Stream == "stderr":
			out.stderr += string(f.Data)
		case f.Result != nil:
			out.result = f.Result
		case f.Error != "":
			out.errFrame = f.Error
		}
	}
	return out
}

func TestExecStream(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	sb := e.create(alice, node.SandboxSpec{})
	cases := []struct {
		name           string
		req            node.ExecRequest
		stdin          string
		stdout, stderr string
		exit           int
	}{
		{"echo", node.ExecRequest{Args: []string{"echo", "hello", "world"}}, "", "hello world\n", "", 0},
		{"shell", node.ExecRequest{Shell: "echo via shell"}, "", "via shell\n", "", 0},
		{"stderr", node.ExecRequest{Args: []string{"err", "oops"}}, "", "", "oops\n", 0},
		{"exit code", node.ExecRequest{Args: []string{"exit", "3"}}, "", "", "", 3},
		{"stdin", node.ExecRequest{Args: []string{"cat"}}, "line1\nline2\n", "line1\nline2\n", "", 0},
		{"big stdin", node.ExecRequest{Args: []string{"cat"}}, strings.Repeat("x", 300<<10), strings.Repeat("x", 300<<10), "", 0},
		{"no stdin", node.ExecRequest{Args: []string{"cat"}}, "", "", "", 0},
		{"missing binary", node.ExecRequest{Args: []string{"nope"}}, "", "", "nope: command not found\n", 127},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.doExec(alice, sb.ID, c.req, c.stdin)
			if r.status != 200 || r.result == nil {
				t.Fatalf("status %d, result %v, err %q", r.status, r.result, r.errFrame)
			}
			if r.stdout != c.stdout || r.stderr != c.stderr || r.result.ExitCode != c.exit {
				t.Fatalf("stdout %q stderr %q exit %d", trunc(r.stdout), trunc(r.stderr), r.result.ExitCode)
			}
			var info node.ExecInfo
			e.doJSON("GET", fmt.Sprintf("/v1/sandboxes/%s/execs/%s", sb.ID, r.execID), alice, nil, http.StatusOK, &info)
			if info.Running || info.Result == nil || info.Result.ExitCode != c.exit {
				t.Fatalf("exec info: %+v", info)
			}
			var res rt.ExecResult
			e.doJSON("GET", fmt.Sprintf("/v1/sandboxes/%s/execs/%s/wait", sb.ID, r.execID), alice, nil, http.StatusOK, &res)
			if res.ExitCode != c.exit {
				t.Fatalf("wait: %+v", res)
			}
		})
	}
	var execs []node.ExecInfo
	e.doJSON("GET", "/v1/sandboxes/"+sb.ID+"/execs", alice, nil, http.StatusOK, &execs)
	if len(execs) != len(cases) {
		t.Fatalf("listed %d execs, want %d", len(execs), len(cases))
	}
	if r := e.doExec(alice, "sb-missing", node.ExecRequest{Args: []string{"echo"}}, ""); r.status != 404 {
		t.Fatalf("exec in missing sandbox: %d", r.status)
	}
}

func trunc(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// TestExecFullDuplex proves stdin and stdout stream concurrently: each
// line's echo is read back before the next line is written.
func TestExecFullDuplex(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	sb := e.create(alice, node.SandboxSpec{})
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", e.srv.URL+"/v1/sandboxes/"+sb.ID+"/exec", pr)
	req.Header.Set("Authorization", "Bearer "+alice)
	respc := make(chan *http.Response, 1)
	errc := make(chan error, 1)
	go func() {
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			errc <- err
			return
		}
		respc <- resp
	}()
	if _, err := io.WriteString(pw, `{"args":["cat"]}`+"\n"); err != nil {
		t.Fatal(err)
	}
	var resp *http.Response
	select {
	case resp = <-respc:
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("no response headers while stdin is open")
	}
	defer resp.Body.Close()
	frames := json.NewDecoder(resp.Body)
	next := func() ExecFrame {
		t.Helper()
		var f ExecFrame
		done := make(chan error, 1)
		go func() { done <- frames.Decode(&f) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no frame while stdin is open: output is not streamed")
		}
		return f
	}
	if h := next(); h.ExecID == "" {
		t.Fatalf("header frame: %+v", h)
	}
	for i := 0; i < 5; i++ {
		line := fmt.Sprintf("ping %d\n", i)
		if _, err := io.WriteString(pw, line); err != nil {
			t.Fatal(err)
		}
		got := ""
		for len(got) < len(line) {
			f := next()
			if f.Stream != "stdout" {
				t.Fatalf("unexpected frame %+v", f)
			}
			got += string(f.Data)
		}
		if got != line {
			t.Fatalf("echo %q, want %q", got, line)
		}
	}
	pw.Close()
	if f := next(); f.Result == nil || f.Result.ExitCode != 0 {
		t.Fatalf("last frame: %+v", f)
	}
}

// TestExecSignalAndClientGone: a long exec can be signalled through the
// API; when its client disconnects the handler returns and the exec's
// result is still recorded.
func TestExecSignal(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	sb := e.create(alice, node.SandboxSpec{})
	done := make(chan execReply, 1)
	go func() { done <- e.doExec(alice, sb.ID, node.ExecRequest{Args: []string{"sleep"}}, "") }()
	var execs []node.ExecInfo
	deadline := time.Now().Add(10 * time.Second)
	for len(execs) == 0 || !execs[0].Running {
		if time.Now().After(deadline) {
			t.Fatal("exec never showed as running")
		}
		e.doJSON("GET", "/v1/sandboxes/"+sb.ID+"/execs", alice, nil, http.StatusOK, &execs)
		time.Sleep(10 * time.Millisecond)
	}
	e.doJSON("POST", "/v1/sandboxes/"+sb.ID+"/execs/"+execs[0].ExecID+"/signal", alice, `{"signal":15}`, http.StatusNoContent, nil)
	r := <-done
	if r.result == nil || r.result.ExitCode != 128+15 {
		t.Fatalf("signalled exec: %+v", r)
	}
	if x := e.do("POST", "/v1/sandboxes/"+sb.ID+"/execs/"+execs[0].ExecID+"/signal", alice, `{"signal":9}`); x.status != 409 {
		t.Fatalf("signal after exit: %d %s", x.status, x.body)
	}
}

// genReader yields n pseudo-random bytes without holding them.
type genReader struct {
	rng *rand.ChaCha8
	n   int64
}

func (g *genReader) Read(p []byte) (int, error) {
	if g.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > g.n {
		p = p[:g.n]
	}
	_, _ = g.rng.Read(p)
	g.n -= int64(len(p))
	return len(p), nil
}

func totalAlloc() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.TotalAlloc
}

// TestFileStream100MiB uploads and downloads 100 MiB. The bytes allocated
// over each transfer (client and server together, cumulative) stay far
// below the file's size, so neither side buffers it whole.
func TestFileStream100MiB(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	sb := e.create(alice, node.SandboxSpec{})
	const size = 100 << 20
	const budget = 16 << 20

	src := &genReader{rng: rand.NewChaCha8([32]byte{1}), n: size}
	want := sha256.New()
	body := io.TeeReader(src, want)
	req, _ := http.NewRequest("PUT", e.srv.URL+"/v1/sandboxes/"+sb.ID+"/files?path=/data/big.bin&mode=0600", body)
	req.Header.Set("Authorization", "Bearer "+alice)
	before := totalAlloc()
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var fi node.FileInfo
	if err := json.NewDecoder(resp.Body).Decode(&fi); err != nil || resp.StatusCode != 200 {
		t.Fatalf("upload: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	upAlloc := totalAlloc() - before
	if fi.Size != size || fi.Mode.Perm() != 0o600 {
		t.Fatalf("uploaded file: %+v", fi)
	}
	t.Logf("upload of %d MiB allocated %.1f MiB", size>>20, float64(upAlloc)/(1<<20))
	if upAlloc > budget {
		t.Fatalf("upload allocated %d bytes: the body is being buffered", upAlloc)
	}

	req, _ = http.NewRequest("GET", e.srv.URL+"/v1/sandboxes/"+sb.ID+"/files?path=/data/big.bin", nil)
	req.Header.Set("Authorization", "Bearer "+alice)
	before = totalAlloc()
	resp, err = e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got := sha256.New()
	n, err := io.Copy(got, resp.Body)
	downAlloc := totalAlloc() - before
	if err != nil || n != size {
		t.Fatalf("download: %d bytes, %v", n, err)
	}
	if resp.Header.Get("X-Dsec-Mode") != "0600" || resp.ContentLength != size {
		t.Fatalf("headers: mode %q length %d", resp.Header.Get("X-Dsec-Mode"), resp.ContentLength)
	}
	if string(got.Sum(nil)) != string(want.Sum(nil)) {
		t.Fatal("downloaded bytes differ from uploaded ones")
	}
	t.Logf("download of %d MiB allocated %.1f MiB", size>>20, float64(downAlloc)/(1<<20))
	if downAlloc > budget {
		t.Fatalf("download allocated %d bytes: the file is being buffered", downAlloc)
	}
}

func TestFileOps(t *testing.T) {
	e := newEnv(t)
	alice := e.tenant("alice", Quota{})
	sb := e.create(alice, node.SandboxSpec{})
	p := "/v1/sandboxes/" + sb.ID
	e.doJSON("POST", p+"/files/mkdir", alice, MkdirRequest{Path: "/work/sub", Mode: 0o750}, http.StatusNoContent, nil)
	e.doJSON("PUT", p+"/files?path=/work/sub/a.txt", alice, "alpha", http.StatusOK, nil)
	var fi node.FileInfo
	e.doJSON("GET", p+"/files/stat?path=/work/sub/a.txt", alice, nil, http.StatusOK, &fi)
	if fi.Size != 5 || fi.Mode.Perm() != 0o644 || fi.Name != "a.txt" {
		t.Fatalf("stat: %+v", fi)
	}
	e.doJSON("POST", p+"/files/rename", alice, RenameRequest{From: "/work/sub/a.txt", To: "/work/b.txt"}, http.StatusNoContent, nil)
	var list []node.FileInfo
	e.doJSON("GET", p+"/files/list?path=/work&depth=2", alice, nil, http.StatusOK, &list)
	names := []string{}
	for _, f := range list {
		names = append(names, f.Path)
	}
	if strings.Join(names, ",") != "/work/b.txt,/work/sub" {
		t.Fatalf("list: %v", names)
	}
	r := e.doJSON("GET", p+"/files?path=/work/b.txt", alice, nil, http.StatusOK, nil)
	if string(r.body) != "alpha" {
		t.Fatalf("read: %q", r.body)
	}
	if x := e.do("GET", p+"/files?path=/work/missing", alice, nil); x.status != 404 {
		t.Fatalf("missing file: %d", x.status)
	}
	if x := e.do("DELETE", p+"/files?path=/work", alice, nil); x.status == 204 {
		t.Fatal("non-recursive remove of a full directory succeeded")
	}
	e.doJSON("DELETE", p+"/files?path=/work&recursive=true", alice, nil, http.StatusNoContent, nil)
	if x := e.do("GET", p+"/files/stat?path=/work", alice, nil); x.status != 404 {
		t.Fatalf("stat removed: %d", x.status)
	}
}
