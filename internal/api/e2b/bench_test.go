package e2b

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	pb "github.com/dsec-dev/dsec/internal/api/e2b/proto/process"
)

// BenchmarkProcessStart is one Start round trip (start, output, end) over
// loopback HTTP, the real control plane and a fake node: the cost of this
// face and the control plane without a real process.
func BenchmarkProcessStart(b *testing.B) {
	e := newEnv(b)
	sb := e.create(e.key("alice"), nil)
	c := e.envd(sb.SandboxID, sb.EnvdAccessToken)
	no := false
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		st, err := c.proc.Start(context.Background(), connect.NewRequest(&pb.StartRequest{
			Process: &pb.ProcessConfig{Cmd: "echo", Args: []string{"x"}}, Stdin: &no,
		}))
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
		if st.Err() != nil || end == nil {
			b.Fatal(st.Err())
		}
	}
}
