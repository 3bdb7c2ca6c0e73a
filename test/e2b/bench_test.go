package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/dsec-dev/dsec/client"
	pb "github.com/dsec-dev/dsec/internal/api/e2b/proto/process"
	"github.com/dsec-dev/dsec/internal/api/e2b/proto/process/processconnect"
)

// benchServer is a server with a native TCP listener too, so both paths
// are measured over loopback TCP with a token.
func benchServer(b *testing.B) (*server, string, *client.Client) {
	b.Helper()
	native := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(b))
	// A quarter core each: 50 unmeasured newcomers at the default of one
	// core would exceed admission's 2 cores x 20 overcommit on a CI VM.
	s := startServer(b, "--listen", native, "--default-cpu", "0.25")
	s.importImage(template)
	key := s.e2bKey("bench")
	c, err := client.New(native, client.WithToken(key))
	if err != nil {
		b.Fatal(err)
	}
	return s, key, c
}

func (s *server) nodeJSON(b *testing.B, key string, out any, args ...string) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	stdout, stderr, err := s.runNode(ctx, key, "bench.mjs", args...)
	if err != nil {
		b.Fatalf("bench.mjs %v: %v\n%s", args, err, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), out); err != nil {
		b.Fatalf("bench.mjs %v printed %q: %v", args, stdout, err)
	}
}

// BenchmarkExecTrue compares one command round trip: the E2B SDK's
// commands.run("true") (which runs /bin/bash -l -c true) against the
// native API running true and the same bash command line.
func BenchmarkExecTrue(b *testing.B) {
	b.Run("e2b-sdk", func(b *testing.B) {
		s, key, _ := benchServer(b)
		var res struct {
			NsPerOp float64 `json:"ns_per_op"`
		}
		b.ResetTimer()
		s.nodeJSON(b, key, &res, "exec", strconv.Itoa(b.N))
		b.ReportMetric(res.NsPerOp/1e6, "ms/exec")
	})
	// The same wire calls as the SDK, from Go: what the server side of
	// the E2B path costs without Node.js.
	b.Run("e2b-connect-go", func(b *testing.B) {
		s, key, _ := benchServer(b)
		sbID, token := s.createE2B(b, key)
		hc := &http.Client{}
		pc := processconnect.NewProcessClient(hc, s.e2bURL, connect.WithProtoJSON())
		run := func() {
			req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "true"}}, Stdin: new(bool)})
			req.Header().Set("E2b-Sandbox-Id", sbID)
			req.Header().Set("X-Access-Token", token)
			st, err := pc.Start(context.Background(), req)
			if err != nil {
				b.Fatal(err)
			}
			var end *pb.ProcessEvent_EndEvent
			for st.Receive() {
				if e := st.Msg().GetEvent().GetEnd(); e != nil {
					end = e
				}
			}
			st.Close()
			if st.Err() != nil || end == nil || end.GetExitCode() != 0 {
				b.Fatalf("%v %v", st.Err(), end)
			}
		}
		for range 3 {
			run()
		}
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			run()
		}
		b.ReportMetric(float64(time.Since(start).Microseconds())/1e3/float64(b.N), "ms/exec")
	})
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"native-true", []string{"true"}},
		{"native-bash-l-c-true", []string{"/bin/bash", "-l", "-c", "true"}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			_, _, c := benchServer(b)
			ctx := context.Background()
			sb, err := c.CreateSandbox(ctx, client.SandboxSpec{Image: template})
			if err != nil {
				b.Fatal(err)
			}
			defer c.DeleteSandbox(ctx, sb.ID)
			run := func() {
				res, err := c.Exec(ctx, client.ExecRequest{SandboxID: sb.ID, Args: tc.args}, nil, nil, nil)
				if err != nil || res.ExitCode != 0 {
					b.Fatalf("%v %+v", err, res)
				}
			}
			for range 3 {
				run()
			}
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				run()
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/1e3/float64(b.N), "ms/exec")
		})
	}
}

// createE2B creates a sandbox through the E2B REST API.
func (s *server) createE2B(b *testing.B, key string) (id, token string) {
	b.Helper()
	req, _ := http.NewRequest("POST", s.e2bURL+"/sandboxes", strings.NewReader(`{"templateID":"`+template+`","timeout":600}`))
	req.Header.Set("X-API-KEY", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var sb struct{ SandboxID, EnvdAccessToken string }
	if err := json.NewDecoder(resp.Body).Decode(&sb); err != nil || resp.StatusCode != http.StatusCreated {
		b.Fatalf("create: %d %v", resp.StatusCode, err)
	}
	return sb.SandboxID, sb.EnvdAccessToken
}

// BenchmarkCreate50 creates sandboxes 50 at a time (one op = 50 creates),
// through the E2B SDK and through the native API.
func BenchmarkCreate50(b *testing.B) {
	const conc = 50
	b.Run("e2b-sdk", func(b *testing.B) {
		s, key, _ := benchServer(b)
		var res struct {
			Created int     `json:"created"`
			Seconds float64 `json:"seconds"`
		}
		b.ResetTimer()
		s.nodeJSON(b, key, &res, "create", strconv.Itoa(conc*b.N), strconv.Itoa(conc))
		b.ReportMetric(float64(res.Created)/res.Seconds, "sandboxes/s")
	})
	b.Run("native", func(b *testing.B) {
		_, _, c := benchServer(b)
		ctx := context.Background()
		var ids []string
		var mu sync.Mutex
		defer func() {
			for _, id := range ids {
				_ = c.DeleteSandbox(ctx, id)
			}
		}()
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			var wg sync.WaitGroup
			errs := make(chan error, conc)
			for range conc {
				wg.Add(1)
				go func() {
					defer wg.Done()
					sb, err := c.CreateSandbox(ctx, client.SandboxSpec{Image: template})
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					ids = append(ids, sb.ID)
					mu.Unlock()
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(conc*b.N)/time.Since(start).Seconds(), "sandboxes/s")
	})
}
