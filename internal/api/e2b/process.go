package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/api"
	pb "github.com/dsec-dev/dsec/internal/api/e2b/proto/process"
	"github.com/dsec-dev/dsec/internal/api/e2b/proto/process/processconnect"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/runtime"
)

// processService is envd's process.Process over api.Service execs.
type processService struct{ h *Handler }

var _ processconnect.ProcessHandler = (*processService)(nil)

func notImplemented(what string) error {
	return connectError(fmt.Errorf("%s is not supported by dsec: %w", what, errdefs.ErrNotImplemented))
}

// execRequest maps an envd process config onto a dsec exec.
func execRequest(id envdIdentity, cfg *pb.ProcessConfig, tag string) (node.ExecRequest, error) {
	if cfg == nil || cfg.GetCmd() == "" {
		return node.ExecRequest{}, invalid("process.cmd is required")
	}
	req := node.ExecRequest{
		SandboxID: id.sandboxID,
		Args:      append([]string{cfg.GetCmd()}, cfg.GetArgs()...),
		Cwd:       cfg.GetCwd(),
		User:      id.user,
		Tag:       tag,
	}
	keys := make([]string, 0, len(cfg.GetEnvs()))
	for k := range cfg.GetEnvs() {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return req, invalid("env name %q: want a non-empty name without '=' or NUL", k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		req.Env = append(req.Env, k+"="+cfg.GetEnvs()[k])
	}
	return req, nil
}

// endEvent maps a dsec exec result onto envd's end event, the way envd
// reports a Go os.ProcessState: a signalled process has exit code -1,
// exited=false and a status like "signal: killed".
func endEvent(res *runtime.ExecResult, err error) *pb.ProcessEvent_EndEvent {
	if err != nil {
		msg := err.Error()
		return &pb.ProcessEvent_EndEvent{ExitCode: -1, Status: "unknown", Error: &msg}
	}
	end := &pb.ProcessEvent_EndEvent{ExitCode: int32(res.ExitCode), Exited: true, Status: "exit status " + strconv.Itoa(res.ExitCode)}
	if res.Signal != "" {
		name := strings.ToLower(strings.TrimPrefix(res.Signal, "SIG"))
		if n := unix.SignalNum(res.Signal); n != 0 {
			name = n.String()
		}
		end.ExitCode, end.Exited, end.Status = -1, false, "signal: "+name
	}
	if res.TimedOut {
		msg := "the process ran past its timeout and was killed"
		end.Error = &msg
	}
	return end
}

// Start runs a process and streams its start, output and end.
func (s *processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	h := s.h
	id := envdFrom(ctx)
	if req.Msg.Pty != nil {
		return notImplemented("a PTY")
	}
	ereq, err := execRequest(id, req.Msg.GetProcess(), req.Msg.GetTag())
	if err != nil {
		return connectError(err)
	}
	// Absent means true: the SDK before 2.x always had stdin open.
	var stdinR *io.PipeReader
	var stdinW *io.PipeWriter
	if req.Msg.Stdin == nil || req.Msg.GetStdin() {
		stdinR, stdinW = io.Pipe()
	}
	p := newProc(id.sandboxID, req.Msg.GetTag(), stdinW)
	// Subscribe before the process starts so no early output is lost.
	sub := p.subscribe()
	pio := runtime.IO{Stdout: &outputWriter{p: p}, Stderr: &outputWriter{p: p, stderr: true}}
	if stdinR != nil {
		pio.Stdin = stdinR
	}
	info, err := h.svc.StartExec(ctx, id.caller, ereq, pio)
	if err != nil {
		if stdinW != nil {
			_ = stdinW.Close()
		}
		return connectError(err)
	}
	p.execID, p.pid = info.ExecID, uint32(info.Pid)
	h.procs.add(p)
	h.wg.Add(1)
	go h.watch(p, id.caller)
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.StartResponse{Event: ev}) }
	return h.follow(ctx, req.Header(), p, sub, send)
}

// watch waits for a proc's end, publishes it and forgets the proc.
func (h *Handler) watch(p *proc, c api.Caller) {
	defer h.wg.Done()
	res, err := h.svc.WaitExec(h.bg, c, p.sandboxID, p.execID)
	if err != nil && h.bg.Err() != nil {
		err = fmt.Errorf("the server is shutting down: %w", errdefs.ErrUnavailable)
	}
	p.finish(endEvent(res, err))
	h.procs.remove(p)
}

// follow streams a proc to one client: start, output as it comes, end.
// Keepalives go out at the interval the client asked for.
func (h *Handler) follow(ctx context.Context, hdr interface{ Get(string) string }, p *proc, sub *subscriber, send func(*pb.ProcessEvent) error) error {
	if sub == nil { // ended before we could attach
		if err := send(startEv(p.pid)); err != nil {
			return err
		}
		<-p.done
		return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: p.end}})
	}
	defer p.unsubscribe(sub)
	if err := send(startEv(p.pid)); err != nil {
		return err
	}
	tick := time.NewTicker(h.keepaliveInterval(hdr.Get(headerKeepalive)))
	defer tick.Stop()
	for {
		select {
		case ev := <-sub.ch:
			if err := send(ev); err != nil {
				return err
			}
		case <-p.done:
			// Output is flushed before the exec ends: drain, then end.
		drain:
			for {
				select {
				case ev := <-sub.ch:
					if err := send(ev); err != nil {
						return err
					}
				default:
					break drain
				}
			}
			return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: p.end}})
		case <-tick.C:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return connectError(ctx.Err())
		}
	}
}

func startEv(pid uint32) *pb.ProcessEvent {
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: pid}}}
}

func (h *Handler) keepaliveInterval(v string) time.Duration {
	if n, err := strconv.Atoi(v); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return h.keepalive
}

// resolve finds a running exec by envd selector (pid or tag).
func (s *processService) resolve(ctx context.Context, id envdIdentity, sel *pb.ProcessSelector) (*proc, *node.ExecInfo, error) {
	pid, tag := sel.GetPid(), sel.GetTag()
	if pid == 0 && tag == "" {
		return nil, nil, invalid("a process selector (pid or tag) is required")
	}
	if p := s.h.procs.find(id.sandboxID, pid, tag); p != nil {
		return p, &node.ExecInfo{ExecID: p.execID, SandboxID: p.sandboxID, Pid: int(p.pid), Running: true}, nil
	}
	execs, err := s.h.svc.ListExecs(ctx, id.caller, id.sandboxID)
	if err != nil {
		return nil, nil, err
	}
	for i := range execs {
		e := &execs[i]
		if e.Running && (pid != 0 && uint32(e.Pid) == pid || pid == 0 && e.Request.Tag == tag) {
			return nil, e, nil
		}
	}
	if pid != 0 {
		return nil, nil, fmt.Errorf("process with pid %d is not running: %w", pid, errdefs.ErrNotFound)
	}
	return nil, nil, fmt.Errorf("process with tag %q is not running: %w", tag, errdefs.ErrNotFound)
}

// Connect attaches to a running process: its output from now on and its
// end. A process this face did not start gets start and end only.
func (s *processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	id := envdFrom(ctx)
	p, info, err := s.resolve(ctx, id, req.Msg.GetProcess())
	if err != nil {
		return connectError(err)
	}
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.ConnectResponse{Event: ev}) }
	if p != nil {
		return s.h.follow(ctx, req.Header(), p, p.subscribe(), send)
	}
	if err := send(startEv(uint32(info.Pid))); err != nil {
		return err
	}
	res, err := s.h.svc.WaitExec(ctx, id.caller, id.sandboxID, info.ExecID)
	if err != nil && ctx.Err() != nil {
		return connectError(ctx.Err())
	}
	return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: endEvent(res, err)}})
}

// List returns the running processes of the sandbox.
func (s *processService) List(ctx context.Context, req *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	id := envdFrom(ctx)
	execs, err := s.h.svc.ListExecs(ctx, id.caller, id.sandboxID)
	if err != nil {
		return nil, connectError(err)
	}
	out := &pb.ListResponse{}
	for _, e := range execs {
		if !e.Running {
			continue
		}
		out.Processes = append(out.Processes, processInfo(e))
	}
	return connect.NewResponse(out), nil
}

func processInfo(e node.ExecInfo) *pb.ProcessInfo {
	cfg := &pb.ProcessConfig{Envs: map[string]string{}}
	args := e.Request.Args
	if len(args) == 0 && e.Request.Shell != "" {
		args = []string{"/bin/sh", "-c", e.Request.Shell}
	}
	if len(args) > 0 {
		cfg.Cmd, cfg.Args = args[0], args[1:]
	}
	for _, kv := range e.Request.Env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			cfg.Envs[k] = v
		}
	}
	if e.Request.Cwd != "" {
		cwd := e.Request.Cwd
		cfg.Cwd = &cwd
	}
	info := &pb.ProcessInfo{Config: cfg, Pid: uint32(e.Pid)}
	if e.Request.Tag != "" {
		tag := e.Request.Tag
		info.Tag = &tag
	}
	return info
}

// SendSignal signals a running process (SIGKILL or SIGTERM, as envd).
func (s *processService) SendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	id := envdFrom(ctx)
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connectError(invalid("signal %d: want SIGNAL_SIGKILL or SIGNAL_SIGTERM", req.Msg.GetSignal()))
	}
	_, info, err := s.resolve(ctx, id, req.Msg.GetProcess())
	if err != nil {
		return nil, connectError(err)
	}
	if err := s.h.svc.SignalExec(ctx, id.caller, id.sandboxID, info.ExecID, int(sig)); err != nil {
		if errdefs.IsFailedPrecondition(err) {
			// It ended between the lookup and the signal: E2B's "not found".
			err = fmt.Errorf("process with pid %d: %w: %w", info.Pid, err, errdefs.ErrNotFound)
			return nil, connect.NewError(connect.CodeNotFound, err)
		}
		return nil, connectError(err)
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

// stdinOf returns the stdin pipe of a process this face started.
func (s *processService) stdinOf(ctx context.Context, id envdIdentity, sel *pb.ProcessSelector) (*proc, error) {
	p, info, err := s.resolve(ctx, id, sel)
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, fmt.Errorf("process with pid %d was not started through this E2B endpoint, so its stdin is not reachable: %w", info.Pid, errdefs.ErrFailedPrecondition)
	}
	if p.stdin == nil {
		return nil, fmt.Errorf("process with pid %d was started without stdin (start it with stdin: true): %w", p.pid, errdefs.ErrFailedPrecondition)
	}
	return p, nil
}

func writeStdin(p *proc, in *pb.ProcessInput) error {
	if in.GetPty() != nil {
		return fmt.Errorf("PTY input is not supported by dsec: %w", errdefs.ErrNotImplemented)
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if _, err := p.stdin.Write(in.GetStdin()); err != nil {
		if errors.Is(err, io.ErrClosedPipe) {
			return fmt.Errorf("stdin of process %d is closed: %w", p.pid, errdefs.ErrFailedPrecondition)
		}
		return err
	}
	return nil
}

// SendInput writes to a process's stdin.
func (s *processService) SendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := s.stdinOf(ctx, envdFrom(ctx), req.Msg.GetProcess())
	if err == nil {
		err = writeStdin(p, req.Msg.GetInput())
	}
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

// StreamInput writes a stream of input to a process's stdin: a start event
// naming the process, then data events.
func (s *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	id := envdFrom(ctx)
	var p *proc
	for stream.Receive() {
		msg := stream.Msg()
		switch ev := msg.GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			if p != nil {
				return nil, connectError(invalid("a second start event in one input stream"))
			}
			var err error
			if p, err = s.stdinOf(ctx, id, ev.Start.GetProcess()); err != nil {
				return nil, connectError(err)
			}
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, connectError(invalid("input data before the start event"))
			}
			if err := writeStdin(p, ev.Data.GetInput()); err != nil {
				return nil, connectError(err)
			}
		case *pb.StreamInputRequest_Keepalive:
		default:
			return nil, connectError(invalid("an input stream event without a kind"))
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

// CloseStdin closes a process's stdin (EOF).
func (s *processService) CloseStdin(ctx context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := s.stdinOf(ctx, envdFrom(ctx), req.Msg.GetProcess())
	if err != nil {
		return nil, connectError(err)
	}
	p.closeStdin()
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

// Update resizes a PTY; dsec has none.
func (s *processService) Update(ctx context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	return nil, notImplemented("a PTY")
}
