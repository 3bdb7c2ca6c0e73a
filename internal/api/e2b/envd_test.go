package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	fspb "github.com/dsec-dev/dsec/internal/api/e2b/proto/filesystem"
	pb "github.com/dsec-dev/dsec/internal/api/e2b/proto/process"
	"github.com/dsec-dev/dsec/internal/runtime"
)

func codeOf(err error) connect.Code {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code()
	}
	return 0
}

// events collects a process stream: pid, stdout, stderr and the end.
type events struct {
	pid            uint32
	stdout, stderr string
	end            *pb.ProcessEvent_EndEvent
	order          []string
}

func collect(t *testing.T, next func() bool, msg func() *pb.ProcessEvent, err func() error) events {
	t.Helper()
	var ev events
	for next() {
		switch e := msg().GetEvent().(type) {
		case *pb.ProcessEvent_Start:
			ev.pid = e.Start.GetPid()
			ev.order = append(ev.order, "start")
		case *pb.ProcessEvent_Data:
			ev.stdout += string(e.Data.GetStdout())
			ev.stderr += string(e.Data.GetStderr())
			ev.order = append(ev.order, "data")
		case *pb.ProcessEvent_End:
			ev.end = e.End
			ev.order = append(ev.order, "end")
		}
	}
	if e := err(); e != nil {
		t.Fatalf("stream: %v", e)
	}
	return ev
}

func (c *envd) run(t *testing.T, cmd string, args ...string) events {
	t.Helper()
	f := false
	st, err := c.proc.Start(context.Background(), connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: cmd, Args: args}, Stdin: &f,
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	return collect(t, st.Receive, func() *pb.ProcessEvent { return st.Msg().GetEvent() }, st.Err)
}

func TestProcessStart(t *testing.T) {
	e := newEnv(t)
	sb := e.create(e.key("alice"), nil)
	c := e.envd(sb.SandboxID, sb.EnvdAccessToken)
	for _, tc := range []struct {
		name           string
		cmd            string
		args           []string
		stdout, stderr string
		code           int32
	}{
		{"stdout", "echo", []string{"hello"}, "hello\n", "", 0},
		{"stderr", "err", []string{"oops"}, "", "oops\n", 0},
		{"exit code", "exit", []string{"3"}, "", "", 3},
		{"missing command", "nope", nil, "", "nope: command not found\n", 127},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := c.run(t, tc.cmd, tc.args...)
			if ev.pid == 0 || ev.order[0] != "start" || ev.order[len(ev.order)-1] != "end" {
				t.Fatalf("events out of order: %v (pid %d)", ev.order, ev.pid)
			}
			if ev.stdout != tc.stdout || ev.stderr != tc.stderr || ev.end.GetExitCode() != tc.code || !ev.end.GetExited() {
				t.Fatalf("got %+v end %+v", ev, ev.end)
			}
			if want := "exit status "; !strings.HasPrefix(ev.end.GetStatus(), want) {
				t.Fatalf("status %q", ev.end.GetStatus())
			}
		})
	}
}

func TestProcessBadInput(t *testing.T) {
	e := newEnv(t)
	sb := e.create(e.key("alice"), nil)
	c := e.envd(sb.SandboxID, sb.EnvdAccessToken)
	start := func(req *pb.StartRequest) error {
		st, err := c.proc.Start(context.Background(), connect.NewRequest(req))
		if err != nil {
			return err
		}
		defer st.Close()
		for st.Receive() {
		}
		return st.Err()
	}
	for _, tc := range []struct {
		name string
		req  *pb.StartRequest
		want connect.Code
	}{
		{"no process", &pb.StartRequest{}, connect.CodeInvalidArgument},
		{"no cmd", &pb.StartRequest{Process: &pb.ProcessConfig{Args: []string{"x"}}}, connect.CodeInvalidArgument},
		{"bad env", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "echo", Envs: map[string]string{"A=B": "c"}}}, connect.CodeInvalidArgument},
		{"relative cwd", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "echo", Cwd: ptr("rel")}}, connect.CodeInvalidArgument},
		{"pty", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "echo"}, Pty: &pb.PTY{}}, connect.CodeUnimplemented},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := codeOf(start(tc.req)); got != tc.want {
				t.Fatalf("code %v, want %v", got, tc.want)
			}
		})
	}
	ctx := context.Background()
	_, err := c.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: 999999}}, Signal: pb.Signal_SIGNAL_SIGKILL}))
	if codeOf(err) != connect.CodeNotFound {
		t.Fatalf("signal to an unknown pid: %v", err)
	}
	_, err = c.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: 1}}}))
	if codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("unspecified signal: %v", err)
	}
	_, err = c.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: &pb.ProcessSelector{}}))
	if codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("empty selector: %v", err)
	}
	if _, err := c.proc.Update(ctx, connect.NewRequest(&pb.UpdateRequest{})); codeOf(err) != connect.CodeUnimplemented {
		t.Fatalf("update: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

// TestBackgroundProcess: a process outlives its Start stream, is listed
// with its tag, can be attached to, and is killed by pid.
func TestBackgroundProcess(t *testing.T) {
	e := newEnv(t)
	sb := e.create(e.key("alice"), nil)
	c := e.envd(sb.SandboxID, sb.EnvdAccessToken)
	ctx, cancel := context.WithCancel(context.Background())
	st, err := c.proc.Start(ctx, connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "sleep", Args: []string{"600"}, Envs: map[string]string{"K": "v"}}, Tag: ptr("bg"), Stdin: ptr(false),
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() || st.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("no start event: %v", st.Err())
	}
	pid := st.Msg().GetEvent().GetStart().GetPid()
	cancel() // the client goes away; the process stays
	st.Close()

	list, err := c.proc.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var found *pb.ProcessInfo
	for _, p := range list.Msg.GetProcesses() {
		if p.GetPid() == pid {
			found = p
		}
	}
	if found == nil || found.GetTag() != "bg" || found.GetConfig().GetCmd() != "sleep" || found.GetConfig().GetEnvs()["K"] != "v" {
		t.Fatalf("list: %v", list.Msg.GetProcesses())
	}
	// Attach by tag, then kill by pid: the attached stream sees the end.
	cs, err := c.proc.Connect(context.Background(), connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: "bg"}}}))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if !cs.Receive() || cs.Msg().GetEvent().GetStart().GetPid() != pid {
		t.Fatalf("connect: no start event for pid %d: %v", pid, cs.Err())
	}
	if _, err := c.proc.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGKILL,
	})); err != nil {
		t.Fatal(err)
	}
	ev := collect(t, cs.Receive, func() *pb.ProcessEvent { return cs.Msg().GetEvent() }, cs.Err)
	if ev.end == nil || ev.end.GetExited() || ev.end.GetExitCode() != -1 || !strings.HasPrefix(ev.end.GetStatus(), "signal: ") {
		t.Fatalf("end after kill: %+v", ev.end)
	}
	_, err = c.proc.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGKILL,
	}))
	if codeOf(err) != connect.CodeNotFound {
		t.Fatalf("killing an ended process: %v (the SDK's kill() returns false on not_found)", err)
	}
}

func TestProcessStdin(t *testing.T) {
	e := newEnv(t)
	sb := e.create(e.key("alice"), nil)
	c := e.envd(sb.SandboxID, sb.EnvdAccessToken)
	st, err := c.proc.Start(context.Background(), connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "cat"}, Stdin: ptr(true),
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Receive() {
		t.Fatal(st.Err())
	}
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: st.Msg().GetEvent().GetStart().GetPid()}}
	ctx := context.Background()
	for _, s := range []string{"one ", "two\n"} {
		if _, err := c.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte(s)}}})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte("x")}}})); codeOf(err) != connect.CodeUnimplemented {
		t.Fatalf("pty input: %v", err)
	}
	if _, err := c.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	ev := collect(t, st.Receive, func() *pb.ProcessEvent { return st.Msg().GetEvent() }, st.Err)
	if ev.stdout != "one two\n" || ev.end.GetExitCode() != 0 {
		t.Fatalf("cat: %+v", ev)
	}
	// A process without stdin refuses input with a clear error.
	st2, err := c.proc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "sleep", Args: []string{"600"}}, Stdin: ptr(false)}))
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	if !st2.Receive() {
		t.Fatal(st2.Err())
	}
	sel2 := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: st2.Msg().GetEvent().GetStart().GetPid()}}
	if _, err := c.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel2, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("x")}}})); codeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("input without stdin: %v", err)
	}
	if _, err := c.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel2, Signal: pb.Signal_SIGNAL_SIGTERM})); err != nil {
		t.Fatal(err)
	}
}

func TestEnvdAuth(t *testing.T) {
	e := newEnv(t)
	key := e.key("alice")
	a := e.create(key, nil)
	b := e.create(e.key("bob"), nil)
	ctx := context.Background()
	list := func(c *envd) error {
		_, err := c.proc.List(ctx, connect.NewRequest(&pb.ListRequest{}))
		return err
	}
	if err := list(e.envd(a.SandboxID, a.EnvdAccessToken)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		c    *envd
		want connect.Code
	}{
		{"no token", e.envd(a.SandboxID, ""), connect.CodeUnauthenticated},
		{"another sandbox's token", e.envd(a.SandboxID, b.EnvdAccessToken), connect.CodeUnauthenticated},
		{"no such sandbox", e.envd("sb-nope", a.EnvdAccessToken), connect.CodeUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := codeOf(list(tc.c)); got != tc.want {
				t.Fatalf("code %v, want %v", got, tc.want)
			}
			if code, _ := tc.c.httpDo(t, "GET", "/files?path=/x", nil, ""); code == http.StatusOK || code == http.StatusNotFound {
				t.Fatalf("files without valid auth: %d", code)
			}
		})
	}
	c := e.envd(a.SandboxID, a.EnvdAccessToken)
	if code, _ := c.httpDo(t, "GET", "/health", nil, ""); code != http.StatusNoContent {
		t.Fatalf("health: %d", code)
	}
	if code := e.do("DELETE", "/sandboxes/"+a.SandboxID, key, nil, nil); code != http.StatusNoContent {
		t.Fatalf("kill: %d", code)
	}
	if code, _ := c.httpDo(t, "GET", "/health", nil, ""); code != http.StatusBadGateway {
		t.Fatalf("health of a killed sandbox: %d, want 502 (the SDK's isRunning() is false)", code)
	}
	if got := codeOf(list(c)); got != connect.CodeUnavailable {
		t.Fatalf("call to a killed sandbox: %v", got)
	}
}

func TestFiles(t *testing.T) {
	e := newEnv(t)
	sb := e.create(e.key("alice"), nil)
	c := e.envd(sb.SandboxID, sb.EnvdAccessToken)
	ctx := context.Background()

	// octet-stream upload, parents created
	bin := bytes.Repeat([]byte{0, 1, 2, 255}, 5000)
	code, body := c.httpDo(t, "POST", "/files?path=/work/a/b.bin", bytes.NewReader(bin), "application/octet-stream")
	var infos []writeInfo
	if code != http.StatusOK || json.Unmarshal(body, &infos) != nil || len(infos) != 1 || infos[0].Path != "/work/a/b.bin" || infos[0].Type != "file" {
		t.Fatalf("upload: %d %s", code, body)
	}
	code, body = c.httpDo(t, "GET", "/files?path=/work/a/b.bin", nil, "")
	if code != http.StatusOK || !bytes.Equal(body, bin) {
		t.Fatalf("download: %d, %d bytes", code, len(body))
	}
	// multipart with paths in the file names, one relative (to /root)
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	for name, data := range map[string]string{"/work/m/one.txt": "1", "rel.txt": "2"} {
		fw, _ := mw.CreateFormFile("file", name)
		_, _ = fw.Write([]byte(data))
	}
	mw.Close()
	code, body = c.httpDo(t, "POST", "/files", &mp, mw.FormDataContentType())
	if code != http.StatusOK || json.Unmarshal(body, &infos) != nil || len(infos) != 2 {
		t.Fatalf("multipart upload: %d %s", code, body)
	}
	if code, body = c.httpDo(t, "GET", "/files?path=rel.txt", nil, ""); code != http.StatusOK || string(body) != "2" {
		t.Fatalf("relative path: %d %q", code, body)
	}
	if code, body = c.httpDo(t, "GET", "/files?path=/root/rel.txt", nil, ""); code != http.StatusOK || string(body) != "2" {
		t.Fatalf("relative path resolves to /root: %d %q", code, body)
	}

	// filesystem RPCs
	ls, err := c.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "/work"}))
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]fspb.FileType{}
	for _, en := range ls.Msg.GetEntries() {
		types[en.GetName()] = en.GetType()
	}
	if types["a"] != fspb.FileType_FILE_TYPE_DIRECTORY || types["m"] != fspb.FileType_FILE_TYPE_DIRECTORY || len(types) != 2 {
		t.Fatalf("list: %v", types)
	}
	if _, err := c.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "/work/x/y"})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "/work/x/y"})); codeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("makeDir of an existing dir: %v (the SDK's makeDir() returns false on already_exists)", err)
	}
	mv, err := c.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: "/work/a/b.bin", Destination: "/work/x/b.bin"}))
	if err != nil || mv.Msg.GetEntry().GetSize() != int64(len(bin)) || mv.Msg.GetEntry().GetPath() != "/work/x/b.bin" {
		t.Fatalf("move: %v %v", mv, err)
	}
	st, err := c.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/work/x"}))
	if err != nil || st.Msg.GetEntry().GetType() != fspb.FileType_FILE_TYPE_DIRECTORY || st.Msg.GetEntry().GetModifiedTime() == nil {
		t.Fatalf("stat: %v %v", st, err)
	}
	if _, err := c.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "/work/x"})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/work/x"})); codeOf(err) != connect.CodeNotFound {
		t.Fatalf("stat after remove: %v", err)
	}
}

func TestFilesBadInput(t *testing.T) {
	e := newEnv(t)
	sb := e.create(e.key("alice"), nil)
	c := e.envd(sb.SandboxID, sb.EnvdAccessToken)
	ctx := context.Background()
	for _, tc := range []struct {
		name, method, path, ctype, body string
		want                            int
	}{
		{"download without path", "GET", "/files", "", "", http.StatusBadRequest},
		{"download of a missing file", "GET", "/files?path=/none", "", "", http.StatusNotFound},
		{"upload without path", "POST", "/files", "application/octet-stream", "x", http.StatusBadRequest},
		{"upload of another type", "POST", "/files?path=/a", "text/plain", "x", http.StatusBadRequest},
		{"broken multipart", "POST", "/files?path=/a", "multipart/form-data; boundary=zz", "garbage", http.StatusBadRequest},
		{"bad gzip", "POST", "/files?path=/a&gz=1", "application/octet-stream", "not gzip", http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Contains(tc.path, "gz=1") {
				c.hdr.Set("Content-Encoding", "gzip")
				defer c.hdr.Del("Content-Encoding")
			}
			if code, body := c.httpDo(t, tc.method, tc.path, strings.NewReader(tc.body), tc.ctype); code != tc.want {
				t.Fatalf("status %d, want %d: %s", code, tc.want, body)
			}
		})
	}
	// Too large: the handler's limit applies.
	e.h.maxUpload = 10
	if code, _ := c.httpDo(t, "POST", "/files?path=/big", strings.NewReader(strings.Repeat("x", 100)), "application/octet-stream"); code != http.StatusBadRequest {
		t.Fatalf("upload over the limit: %d", code)
	}
	if _, err := c.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "/"})); codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("remove /: %v", err)
	}
	if _, err := c.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{})); codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("stat without a path: %v", err)
	}
	if _, err := c.fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: "/"})); codeOf(err) != connect.CodeUnimplemented {
		t.Fatalf("watcher: %v", err)
	}
}

func TestEndEvent(t *testing.T) {
	for _, tc := range []struct {
		name   string
		res    *runtime.ExecResult
		err    error
		code   int32
		exited bool
		status string
		hasErr bool
	}{
		{"success", &runtime.ExecResult{}, nil, 0, true, "exit status 0", false},
		{"failure", &runtime.ExecResult{ExitCode: 2}, nil, 2, true, "exit status 2", false},
		{"killed", &runtime.ExecResult{ExitCode: 137, Signal: "SIGKILL"}, nil, -1, false, "signal: killed", false},
		{"terminated", &runtime.ExecResult{ExitCode: 143, Signal: "SIGTERM"}, nil, -1, false, "signal: terminated", false},
		{"timed out", &runtime.ExecResult{ExitCode: 137, Signal: "SIGKILL", TimedOut: true}, nil, -1, false, "signal: killed", true},
		{"wait failed", nil, errors.New("boom"), -1, false, "unknown", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			end := endEvent(tc.res, tc.err)
			if end.GetExitCode() != tc.code || end.GetExited() != tc.exited || end.GetStatus() != tc.status || (end.Error != nil) != tc.hasErr {
				t.Fatalf("got %+v", end)
			}
		})
	}
}

// TestStdinNotRead: input to a process that does not read blocks the
// sender, not the server: CloseStdin (and the process's end) release it.
func TestStdinNotRead(t *testing.T) {
	e := newEnv(t)
	sb := e.create(e.key("alice"), nil)
	c := e.envd(sb.SandboxID, sb.EnvdAccessToken)
	ctx := context.Background()
	st, err := c.proc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "sleep", Args: []string{"600"}}, Stdin: ptr(true)}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Receive() {
		t.Fatal(st.Err())
	}
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: st.Msg().GetEvent().GetStart().GetPid()}}
	sent := make(chan error, 1)
	go func() {
		_, err := c.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("never read")}}}))
		sent <- err
	}()
	select {
	case err := <-sent:
		t.Fatalf("input to a process that does not read returned at once: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := c.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-sent:
		if codeOf(err) != connect.CodeFailedPrecondition {
			t.Fatalf("blocked input after CloseStdin: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("CloseStdin did not release the blocked input")
	}
	if _, err := c.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
}
