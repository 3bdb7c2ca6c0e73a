package client_test

import (
	"bytes"
	"io"
	"testing"

	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/client/clienttest"
)

func benchClient(b *testing.B) (*client.Client, string) {
	srv := clienttest.NewServer(b, clienttest.ServerOptions{Unix: true, Images: []string{"base"}})
	c, err := client.New(srv.Addr, client.WithToken(""))
	if err != nil {
		b.Fatal(err)
	}
	sb, err := c.CreateSandbox(b.Context(), client.SandboxSpec{Image: "base"})
	if err != nil {
		b.Fatal(err)
	}
	return c, sb.ID
}

// BenchmarkGetSandbox is one JSON round trip over the unix socket: the
// SDK's per-call overhead.
func BenchmarkGetSandbox(b *testing.B) {
	c, id := benchClient(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.GetSandbox(b.Context(), id); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExecStream streams 1 MiB of output through one exec (host cat
// in the fake), measuring frame decoding throughput.
func BenchmarkExecStream(b *testing.B) {
	c, id := benchClient(b)
	in := bytes.Repeat([]byte("x"), 1<<20)
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		res, err := c.Exec(b.Context(), client.ExecRequest{SandboxID: id, Args: []string{"cat"}}, bytes.NewReader(in), io.Discard, nil)
		if err != nil || res.ExitCode != 0 {
			b.Fatal(res, err)
		}
	}
}
