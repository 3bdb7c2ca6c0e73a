package api

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/store"
)

func (s *ControlPlane) reapLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-s.bg.Done():
			return
		case <-t.C:
			if err := s.ReapExpired(s.bg); err != nil && s.bg.Err() == nil {
				s.log.Warn("lifecycle timers", "err", err)
			}
		}
	}
}

// ReapExpired applies lifecycle timers once, at the clock's now: sandboxes
// past their max lifetime are deleted; running sandboxes idle for their
// idle TTL are deleted or paused (spec.OnIdle). A running exec counts as
// activity. The timer loop calls it every ReapInterval. The index names
// the sandboxes whose timers may have fired; only their records are read.
func (s *ControlPlane) ReapExpired(ctx context.Context) error {
	now := s.now()
	var firstErr error
	for _, id := range s.index.due(now, s.memoryActivity) {
		var rec sandboxRecord
		if err := s.st.Get(ctx, store.BucketSandboxes, id, &rec); err != nil {
			if !errdefs.IsNotFound(err) && firstErr == nil {
				firstErr = fmt.Errorf("sandbox %s: %w", id, err)
			}
			continue
		}
		st := rec.Sandbox.State
		if st != node.StateRunning && st != node.StatePaused {
			continue
		}
		var err error
		switch {
		case !rec.Deadline.IsZero() && !now.Before(rec.Deadline):
			s.log.Info("sandbox reached its lifetime", "sandbox", id, "deadline", rec.Deadline)
			err = s.timerDelete(ctx, id, "lifetime")
		case st == node.StateRunning && rec.Sandbox.Spec.IdleTTL > 0 &&
			now.Sub(s.lastActivity(&rec)) >= rec.Sandbox.Spec.IdleTTL:
			if s.execRunning(ctx, &rec) {
				s.touch(ctx, id)
				continue
			}
			s.log.Info("sandbox is idle", "sandbox", id, "idle_ttl", rec.Sandbox.Spec.IdleTTL, "on_idle", rec.Sandbox.Spec.OnIdle)
			if rec.Sandbox.Spec.OnIdle == "pause" {
				err = s.timerPause(ctx, id)
			} else {
				err = s.timerDelete(ctx, id, "idle")
			}
		}
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("sandbox %s: %w", id, err)
		}
	}
	return firstErr
}

func (s *ControlPlane) timerDelete(ctx context.Context, id, reason string) (err error) {
	defer s.done(systemCaller, "DeleteSandbox("+reason+")", &id, &err)
	return ignoreNotFound(s.destroy(ctx, id, reason))
}

func (s *ControlPlane) timerPause(ctx context.Context, id string) (err error) {
	defer s.done(systemCaller, "PauseSandbox(idle)", &id, &err)
	err = s.transition(ctx, id, node.StateRunning, node.StatePaused)
	if errdefs.IsFailedPrecondition(err) || errdefs.IsNotFound(err) {
		return nil // changed under us: nothing to do
	}
	return err
}

func (s *ControlPlane) execRunning(ctx context.Context, rec *sandboxRecord) bool {
	a, err := s.nodes.Node(rec.Sandbox.Node)
	if err != nil {
		return false
	}
	ctx, cancel := s.nodeCtx(ctx)
	defer cancel()
	execs, err := a.ListExecs(ctx, rec.Sandbox.ID)
	if err != nil {
		return false
	}
	for _, e := range execs {
		if e.Running {
			return true
		}
	}
	return false
}

// Reconcile makes the store agree with what the nodes report: sandboxes
// the nodes still run are adopted (state refreshed, exec watchers
// restarted, finished exec results recorded); sandboxes no node reports
// are marked dead with a reason, not dropped; sandboxes a node runs that
// the store does not know are adopted into the store. A node that cannot
// be reached leaves its sandboxes as they were.
func (s *ControlPlane) Reconcile(ctx context.Context) error {
	recs, err := store.ListAll[sandboxRecord](ctx, s.st, store.BucketSandboxes, "")
	if err != nil {
		return err
	}
	known := map[string]*sandboxRecord{}
	for i := range recs {
		known[recs[i].Sandbox.ID] = &recs[i]
	}
	reached := map[string]bool{}
	for _, name := range s.nodes.Nodes() {
		a, err := s.nodes.Node(name)
		if err != nil {
			continue
		}
		nctx, cancel := s.nodeCtx(ctx)
		live, err := a.ListSandboxes(nctx)
		cancel()
		if err != nil {
			s.log.Warn("reconcile: node unreachable; leaving its sandboxes as they are", "node", name, "err", err)
			continue
		}
		reached[name] = true
		for _, sb := range live {
			rec := known[sb.ID]
			if rec == nil {
				s.adoptOrphan(ctx, name, sb)
				continue
			}
			delete(known, sb.ID)
			if err := s.adopt(ctx, a, rec, sb); err != nil {
				return err
			}
		}
	}
	for id, rec := range known {
		if !reached[rec.Sandbox.Node] || rec.Sandbox.State == node.StateDead {
			continue
		}
		reason := "its node no longer reports it"
		if rec.Sandbox.State == node.StateCreating {
			reason = "the server stopped while creating it"
		}
		if _, err := s.markDead(ctx, id, reason); err != nil {
			return err
		}
	}
	return nil
}

func (s *ControlPlane) adopt(ctx context.Context, a node.Agent, rec *sandboxRecord, live node.Sandbox) error {
	id := live.ID
	_, err := s.modify(ctx, id, func(r *sandboxRecord) error {
		r.Sandbox.State, r.Sandbox.Reason, r.Sandbox.Runtime = live.State, live.Reason, live.Runtime
		if live.State == node.StateDead && r.Sandbox.Reason == "" {
			r.Sandbox.Reason = "its processes died while the server was down"
		}
		return nil
	})
	if err != nil || live.State == node.StateDead {
		return err
	}
	nctx, cancel := s.nodeCtx(ctx)
	defer cancel()
	execs, err := a.ListExecs(nctx, id)
	if err != nil {
		s.log.Warn("reconcile: listing execs", "sandbox", id, "err", err)
		return nil
	}
	for _, e := range execs {
		if e.Running {
			s.wg.Add(1)
			go s.watchExec(a, e)
			continue
		}
		if e.Result != nil {
			if err := s.st.Put(ctx, store.BucketExecs, execKey(id, e.ExecID), e); err != nil {
				return err
			}
		}
	}
	return nil
}

// adoptOrphan records a sandbox a node runs that the store lost, so it is
// visible, counted against its tenant and subject to timers again.
func (s *ControlPlane) adoptOrphan(ctx context.Context, nodeName string, sb node.Sandbox) {
	if sb.Spec.Tenant == "" {
		sb.Spec.Tenant = AdminTenant
	}
	sb.Node = nodeName
	rec := sandboxRecord{Sandbox: sb}
	if sb.Spec.MaxLifetime > 0 {
		rec.Deadline = sb.CreatedAt.Add(sb.Spec.MaxLifetime)
	}
	indexed := false
	err := s.st.Update(ctx, func(tx store.Tx) error {
		if err := tx.Put(ctx, store.BucketSandboxes, sb.ID, &rec); err != nil {
			return err
		}
		s.index.put(&rec)
		indexed = true
		return nil
	})
	if err != nil {
		if indexed {
			s.index.resync(ctx, s.st, sb.ID)
		}
		s.log.Error("reconcile: adopting an unknown sandbox", "sandbox", sb.ID, "err", err)
		return
	}
	s.log.Warn("reconcile: adopted a sandbox the store did not know", "sandbox", sb.ID, "node", nodeName, "tenant", sb.Spec.Tenant)
}

// NodeInfo implements Service.
func (s *ControlPlane) NodeInfo(ctx context.Context, c Caller) (_ []node.NodeInfo, err error) {
	defer s.done(c, "NodeInfo", nil, &err)
	out := []node.NodeInfo{}
	for _, name := range s.nodes.Nodes() {
		a, err := s.nodes.Node(name)
		if err != nil {
			return nil, err
		}
		info, err := a.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", name, err)
		}
		out = append(out, *info)
	}
	return out, nil
}

// Capacity implements Service: how many more sandboxes of this shape fit
// across nodes, further bounded by the caller's quota.
func (s *ControlPlane) Capacity(ctx context.Context, c Caller, shape node.SandboxSpec) (_ *node.Capacity, err error) {
	defer s.done(c, "Capacity", nil, &err)
	if shape.Image == "" {
		shape.Image = "-" // the shape needs none
	}
	if err := s.prepareSpec(&shape); err != nil {
		return nil, err
	}
	total := &node.Capacity{Detail: map[string]int{}}
	best := -1
	for _, name := range s.nodes.Nodes() {
		a, err := s.nodes.Node(name)
		if err != nil {
			return nil, err
		}
		capy, err := a.Capacity(ctx, shape)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", name, err)
		}
		total.Fits += capy.Fits
		for k, v := range capy.Detail {
			total.Detail[k] += v
		}
		if capy.Fits > best {
			best, total.LimitingResource = capy.Fits, capy.LimitingResource
		}
	}
	var t Tenant
	if err := s.st.Get(ctx, store.BucketTenants, c.Tenant, &t); err != nil {
		if errdefs.IsNotFound(err) {
			return total, nil
		}
		return nil, err
	}
	u := s.index.tenantUsage(c.Tenant)
	q := t.Quota
	limit := func(res string, n int) {
		if n < 0 {
			n = 0
		}
		total.Detail["quota_"+res] = n
		if n < total.Fits {
			total.Fits, total.LimitingResource = n, "quota_"+res
		}
	}
	if q.Sandboxes > 0 {
		limit("sandboxes", q.Sandboxes-u.Sandboxes)
	}
	if q.CPU > 0 && shape.CPU > 0 {
		limit("cpu", int(math.Floor((q.CPU-u.CPU)/shape.CPU+1e-9)))
	}
	if q.MemoryBytes > 0 && shape.MemoryBytes > 0 {
		limit("memory", int((q.MemoryBytes-u.MemoryBytes)/shape.MemoryBytes))
	}
	if q.DiskBytes > 0 && shape.DiskBytes > 0 {
		limit("disk", int((q.DiskBytes-u.DiskBytes)/shape.DiskBytes))
	}
	return total, nil
}
