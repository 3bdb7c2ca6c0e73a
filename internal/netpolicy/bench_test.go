package netpolicy

import (
	"context"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/node"
)

// benchManager is a Manager on the lab subnet and one sandbox namespace;
// no test hosts, no traffic.
func benchManager(b *testing.B) (*Manager, string) {
	b.Helper()
	l := newLab(b)
	_, path := l.newNS("bench")
	m, _ := labManager(b, l, nil)
	return m, path
}

var benchPolicy = node.NetworkPolicy{
	Allow: []node.NetworkRule{{CIDR: "10.250.1.2", Ports: "8080,9090", Protocol: "tcp"}, {CIDR: "10.250.2.0/24", Ports: "443"}},
	Deny:  []node.NetworkRule{{CIDR: "10.250.2.9"}},
}

func BenchmarkAttachDetach(b *testing.B) {
	m, path := benchManager(b)
	ctx := context.Background()
	b.ReportAllocs()
	var attach, detach time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := m.Attach(ctx, "bench", path, benchPolicy); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := m.Detach(ctx, "bench"); err != nil {
			b.Fatal(err)
		}
		attach += t1.Sub(t0)
		detach += time.Since(t1)
	}
	b.ReportMetric(float64(attach.Microseconds())/float64(b.N), "attach-µs/op")
	b.ReportMetric(float64(detach.Microseconds())/float64(b.N), "detach-µs/op")
}

func BenchmarkUpdate(b *testing.B) {
	m, path := benchManager(b)
	ctx := context.Background()
	if err := m.Attach(ctx, "bench", path, benchPolicy); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := m.Update(ctx, "bench", benchPolicy); err != nil {
			b.Fatal(err)
		}
	}
}
