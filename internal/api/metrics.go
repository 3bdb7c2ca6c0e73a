package api

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/dsec-dev/dsec/internal/node"
)

type metrics struct {
	reg            *prometheus.Registry
	creations      prometheus.Counter
	deletions      *prometheus.CounterVec
	createFailures *prometheus.CounterVec
	createSeconds  prometheus.Histogram
	execSeconds    prometheus.Histogram
}

func newMetrics(s *ControlPlane) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		creations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dsec_sandbox_creations_total", Help: "Sandboxes created.",
		}),
		deletions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dsec_sandbox_deletions_total", Help: "Sandboxes deleted, by reason (deleted, idle, lifetime, fork rolled back).",
		}, []string{"reason"}),
		createFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dsec_sandbox_create_failures_total", Help: "Failed sandbox creations, by error code.",
		}, []string{"code"}),
		createSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dsec_sandbox_create_seconds", Help: "Time to create a sandbox, until it is ready.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
		execSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dsec_exec_seconds", Help: "Duration of execs, start to exit.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 20),
		}),
	}
	m.reg.MustRegister(m.creations, m.deletions, m.createFailures, m.createSeconds, m.execSeconds,
		&stateCollector{s: s},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

var (
	descSandboxes       = prometheus.NewDesc("dsec_sandboxes", "Sandboxes by state.", []string{"state"}, nil)
	descNodeCPUs        = prometheus.NewDesc("dsec_node_cpus", "CPUs of a node.", []string{"node"}, nil)
	descNodeCPUReq      = prometheus.NewDesc("dsec_node_cpu_requested_cores", "CPU requested by sandboxes on a node.", []string{"node"}, nil)
	descNodeCPUUsed     = prometheus.NewDesc("dsec_node_cpu_used_cores", "CPU used by sandboxes on a node (recent rate).", []string{"node"}, nil)
	descNodeMem         = prometheus.NewDesc("dsec_node_memory_bytes", "Memory of a node.", []string{"node"}, nil)
	descNodeMemHeld     = prometheus.NewDesc("dsec_node_memory_held_bytes", "Memory held by sandboxes on a node.", []string{"node"}, nil)
	descNodeMemReclaim  = prometheus.NewDesc("dsec_node_memory_reclaimable_bytes", "Of the memory held by sandboxes on a node, what the kernel can take back without killing anything.", []string{"node"}, nil)
	descNodeMemAvail    = prometheus.NewDesc("dsec_node_memory_available_bytes", "Memory the node could reuse now (MemAvailable).", []string{"node"}, nil)
	descNodeUp          = prometheus.NewDesc("dsec_node_up", "1 if the node answered the last scrape.", []string{"node"}, nil)
	descTenantSandboxes = prometheus.NewDesc("dsec_tenant_sandboxes", "Sandboxes holding resources, per tenant.", []string{"tenant"}, nil)
	descTenantCPUReq    = prometheus.NewDesc("dsec_tenant_cpu_requested_cores", "CPU requested, per tenant.", []string{"tenant"}, nil)
	descTenantCPUUsed   = prometheus.NewDesc("dsec_tenant_cpu_used_cores", "CPU used, per tenant (recent rate).", []string{"tenant"}, nil)
	descTenantMemLimit  = prometheus.NewDesc("dsec_tenant_memory_limit_bytes", "Sum of memory limits, per tenant.", []string{"tenant"}, nil)
	descTenantMemHeld   = prometheus.NewDesc("dsec_tenant_memory_held_bytes", "Memory held, per tenant.", []string{"tenant"}, nil)
)

// stateCollector computes gauges at scrape time from the store and the
// nodes, so they cannot drift from the truth.
type stateCollector struct{ s *ControlPlane }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSandboxes, descNodeCPUs, descNodeCPUReq, descNodeCPUUsed, descNodeMem,
		descNodeMemHeld, descNodeMemReclaim, descNodeMemAvail, descNodeUp, descTenantSandboxes, descTenantCPUReq, descTenantCPUUsed, descTenantMemLimit, descTenantMemHeld} {
		ch <- d
	}
}

type tenantFigures struct {
	sandboxes         int
	cpuReq, cpuUsed   float64
	memLimit, memHeld int64
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	ctx, cancel := context.WithTimeout(s.bg, 5*time.Second)
	defer cancel()
	gauge := func(d *prometheus.Desc, v float64, label string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, label)
	}
	for _, name := range s.nodes.Nodes() {
		a, err := s.nodes.Node(name)
		var info *node.NodeInfo
		if err == nil {
			info, err = a.Info(ctx)
		}
		if err != nil {
			gauge(descNodeUp, 0, name)
			continue
		}
		gauge(descNodeUp, 1, name)
		gauge(descNodeCPUs, float64(info.CPUs), name)
		gauge(descNodeCPUReq, info.CPURequested, name)
		gauge(descNodeCPUUsed, info.CPUUsed, name)
		gauge(descNodeMem, float64(info.MemoryBytes), name)
		gauge(descNodeMemHeld, float64(info.MemoryHeldBytes), name)
		gauge(descNodeMemReclaim, float64(info.MemoryReclaimableBytes), name)
		gauge(descNodeMemAvail, float64(info.MemAvailable), name)
	}
	recs, err := s.listRecords(ctx)
	if err != nil {
		s.log.Warn("metrics: listing sandboxes", "err", err)
		return
	}
	states := map[string]int{node.StateCreating: 0, node.StateRunning: 0, node.StatePaused: 0, node.StateDead: 0}
	tenants := map[string]*tenantFigures{}
	for _, r := range recs {
		sb := r.Sandbox
		states[sb.State]++
		if !holdsResources(sb.State) {
			continue
		}
		t := tenants[sb.Spec.Tenant]
		if t == nil {
			t = &tenantFigures{}
			tenants[sb.Spec.Tenant] = t
		}
		t.sandboxes++
		t.cpuReq += sb.Spec.CPU
		t.memLimit += sb.Spec.MemoryBytes
		if sb.State != node.StateRunning && sb.State != node.StatePaused {
			continue
		}
		if a, err := s.nodes.Node(sb.Node); err == nil {
			if st, err := a.SandboxStats(ctx, sb.ID); err == nil {
				t.cpuUsed += st.CPUUsed
				t.memHeld += st.MemoryHeldBytes
			}
		}
	}
	for st, n := range states {
		gauge(descSandboxes, float64(n), st)
	}
	for name, t := range tenants {
		gauge(descTenantSandboxes, float64(t.sandboxes), name)
		gauge(descTenantCPUReq, t.cpuReq, name)
		gauge(descTenantCPUUsed, t.cpuUsed, name)
		gauge(descTenantMemLimit, float64(t.memLimit), name)
		gauge(descTenantMemHeld, float64(t.memHeld), name)
	}
}
