package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"sort"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/store"
)

// CreateSandbox implements Service.
func (s *ControlPlane) CreateSandbox(ctx context.Context, c Caller, spec node.SandboxSpec) (_ *node.Sandbox, err error) {
	defer s.done(c, "CreateSandbox", &spec.ID, &err)
	return s.create(ctx, c, &spec)
}

// create validates, places, reserves and creates one sandbox. Anything it
// reserved or created is undone when it fails.
func (s *ControlPlane) create(ctx context.Context, c Caller, spec *node.SandboxSpec) (_ *node.Sandbox, err error) {
	start := time.Now()
	defer func() {
		if err != nil {
			s.metrics.createFailures.WithLabelValues(ErrorCode(err)).Inc()
		}
	}()
	switch {
	case spec.Tenant == "" || (!c.Admin && spec.Tenant == c.Tenant):
		spec.Tenant = c.Tenant
	case !c.Admin:
		return nil, fmt.Errorf("tenant %q: sandboxes can be created only for your own tenant: %w", spec.Tenant, errdefs.ErrPermissionDenied)
	}
	if err := s.prepareSpec(spec); err != nil {
		return nil, err
	}
	pinned := ""
	if spec.FromSandbox != "" {
		src, err := s.load(ctx, c, spec.FromSandbox)
		if err != nil {
			return nil, err
		}
		if st := src.Sandbox.State; st != node.StateRunning && st != node.StatePaused {
			return nil, fmt.Errorf("sandbox %s is %s and cannot be forked: %w", src.Sandbox.ID, st, errdefs.ErrFailedPrecondition)
		}
		if src.Sandbox.Spec.Tenant != spec.Tenant {
			return nil, notFound(spec.FromSandbox)
		}
		// The copy of the file system is local to the source's node.
		pinned = src.Sandbox.Node
		if spec.Image == "" {
			spec.Image = src.Sandbox.Spec.Image
		}
	} else if err := s.checkImageUse(ctx, spec.Tenant, c.Admin, spec.Image); err != nil {
		return nil, err
	}

	name, agent, err := s.place(ctx, *spec, pinned)
	if err != nil {
		return nil, err
	}
	now := s.now()
	rec := sandboxRecord{Sandbox: node.Sandbox{
		Spec: *spec, ID: spec.ID, Node: name, State: node.StateCreating, CreatedAt: now, LastActivity: now,
	}}
	if spec.MaxLifetime > 0 {
		rec.Deadline = now.Add(spec.MaxLifetime)
	}
	if err := s.reserve(ctx, &rec); err != nil {
		return nil, err
	}

	created, err := agent.CreateSandbox(ctx, *spec)
	if err != nil {
		s.undoCreate(ctx, agent, &rec, !errdefs.IsAlreadyExists(err))
		return nil, err
	}
	sb := *created
	sb.Spec.Tenant = spec.Tenant
	sb.Node = name
	sb.CreatedAt, sb.LastActivity = now, now
	rec.Sandbox = sb
	// The one write of a create: the reservation was in memory until now.
	if err := s.putNewRecord(context.WithoutCancel(ctx), &rec); err != nil {
		// The index took the record in the failed transaction: back to
		// a reservation, which undoCreate releases.
		s.index.putCreating(&rec)
		s.undoCreate(ctx, agent, &rec, true)
		return nil, fmt.Errorf("recording sandbox %s: %w", spec.ID, err)
	}
	// The record already holds now as last activity: no second write.
	s.actMu.Lock()
	s.activity[spec.ID], s.persisted[spec.ID] = now, now
	s.actMu.Unlock()
	s.metrics.creations.Inc()
	s.metrics.createSeconds.Observe(time.Since(start).Seconds())
	return s.view(&rec), nil
}

// putNewRecord writes the record of a sandbox its node has just made.
func (s *ControlPlane) putNewRecord(ctx context.Context, rec *sandboxRecord) error {
	id := rec.Sandbox.ID
	err := s.st.Update(ctx, func(tx store.Tx) error {
		// The reservation keeps other creates off this id; this guards
		// against a record the index does not know of.
		var existing sandboxRecord
		if err := tx.Get(ctx, store.BucketSandboxes, id, &existing); err == nil {
			return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrAlreadyExists)
		} else if !errdefs.IsNotFound(err) {
			return err
		}
		if err := tx.Put(ctx, store.BucketSandboxes, id, rec); err != nil {
			return err
		}
		s.index.put(rec)
		return nil
	})
	return err
}

// undoCreate removes what a failed create left: the sandbox on the node
// (unless the node refused because the id was taken there) and the
// reservation. It runs even if the caller's context was cancelled.
func (s *ControlPlane) undoCreate(ctx context.Context, agent node.Agent, rec *sandboxRecord, onNode bool) {
	ctx, cancel := s.nodeCtx(ctx)
	defer cancel()
	id := rec.Sandbox.ID
	if onNode {
		if err := ignoreNotFound(agent.DeleteSandbox(ctx, id)); err != nil {
			// Recorded as dead, so it stays visible and deletable (a
			// delete asks the node again).
			s.log.Error("cleaning up a failed create on its node", "sandbox", id, "err", err)
			dead := *rec
			dead.Sandbox.State, dead.Sandbox.Reason = node.StateDead, "create failed and cleanup failed: "+err.Error()
			if err := s.putNewRecord(ctx, &dead); err != nil {
				// Not recorded: the next start adopts it from the node.
				s.index.remove(id)
				s.log.Error("recording a failed create", "sandbox", id, "err", err)
			}
			return
		}
	}
	s.index.remove(id)
}

// holdsResources says whether a sandbox in this state counts against its
// tenant's quota. Dead sandboxes hold nothing on their node any more.
func holdsResources(state string) bool {
	return state == node.StateCreating || state == node.StateRunning || state == node.StatePaused
}

// usage is what one tenant holds.
type usage struct {
	Sandboxes   int
	CPU         float64
	MemoryBytes int64
	DiskBytes   int64
}

// checkQuota names the first quota the request would exceed.
func checkQuota(t *Tenant, u usage, spec node.SandboxSpec) error {
	q := t.Quota
	exceeded := func(res string, req, used, limit any) error {
		return fmt.Errorf("tenant %s quota exceeded: %s (requested %v, in use %v, limit %v): %w",
			t.Name, res, req, used, limit, errdefs.ErrResourceExhausted)
	}
	switch {
	case q.Sandboxes > 0 && u.Sandboxes+1 > q.Sandboxes:
		return exceeded("sandboxes", 1, u.Sandboxes, q.Sandboxes)
	case q.CPU > 0 && u.CPU+spec.CPU > q.CPU+1e-9:
		return exceeded("cpu", spec.CPU, u.CPU, q.CPU)
	case q.MemoryBytes > 0 && u.MemoryBytes+spec.MemoryBytes > q.MemoryBytes:
		return exceeded("memory", spec.MemoryBytes, u.MemoryBytes, q.MemoryBytes)
	case q.DiskBytes > 0 && u.DiskBytes+spec.DiskBytes > q.DiskBytes:
		return exceeded("disk", spec.DiskBytes, u.DiskBytes, q.DiskBytes)
	}
	return nil
}

// reserve checks the tenant's quota and counts the sandbox against it, in
// memory (see sandboxIndex): concurrent creates see each other's
// reservations and cannot overshoot, and a crash leaves nothing reserved.
func (s *ControlPlane) reserve(ctx context.Context, rec *sandboxRecord) error {
	spec := rec.Sandbox.Spec
	// A tenant being deleted waits for reservations already made and
	// is then gone for later ones.
	s.tenantMu.RLock()
	defer s.tenantMu.RUnlock()
	var t Tenant
	if err := s.st.Get(ctx, store.BucketTenants, spec.Tenant, &t); err != nil {
		switch {
		case errdefs.IsNotFound(err) && spec.Tenant == AdminTenant:
			t = Tenant{Name: AdminTenant, Admin: true} // before Start created it
		case errdefs.IsNotFound(err):
			return fmt.Errorf("tenant %q: %w", spec.Tenant, errdefs.ErrNotFound)
		default:
			return err
		}
	}
	return s.index.reserve(rec, func(u usage) error {
		if t.Quota == (Quota{}) {
			return nil
		}
		return checkQuota(&t, u, spec)
	})
}

// place picks the node with the most room for spec (or the pinned node).
// Nodes that cannot say (no admission policy) are tried last; the node
// still refuses at create time if its own admission fails.
func (s *ControlPlane) place(ctx context.Context, spec node.SandboxSpec, pinned string) (string, node.Agent, error) {
	names := s.nodes.Nodes()
	if pinned != "" {
		names = []string{pinned}
	}
	if len(names) == 1 {
		// Nothing to choose: the node's admission at create time
		// decides, and measuring the node twice per create would cost
		// as much as the rest of the control plane's work.
		a, err := s.nodes.Node(names[0])
		if err != nil {
			return "", nil, fmt.Errorf("no node has room for this sandbox ([%s: %v]): %w", names[0], err, errdefs.ErrResourceExhausted)
		}
		return names[0], a, nil
	}
	type cand struct {
		name  string
		agent node.Agent
		fits  int
	}
	var cands []cand
	var refusals []string
	for _, n := range names {
		a, err := s.nodes.Node(n)
		if err != nil {
			refusals = append(refusals, fmt.Sprintf("%s: %v", n, err))
			continue
		}
		capy, err := a.Capacity(ctx, spec)
		switch {
		case errdefs.IsNotImplemented(err):
			cands = append(cands, cand{n, a, -1})
		case err != nil:
			refusals = append(refusals, fmt.Sprintf("%s: %v", n, err))
		case capy.Fits > 0:
			cands = append(cands, cand{n, a, capy.Fits})
		default:
			refusals = append(refusals, fmt.Sprintf("%s: not enough %s", n, capy.LimitingResource))
		}
	}
	if len(cands) == 0 {
		if len(names) == 0 {
			return "", nil, fmt.Errorf("no nodes: %w", errdefs.ErrUnavailable)
		}
		return "", nil, fmt.Errorf("no node has room for this sandbox (%v): %w", refusals, errdefs.ErrResourceExhausted)
	}
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].fits > cands[j].fits })
	return cands[0].name, cands[0].agent, nil
}

// GetSandbox implements Service. It refreshes the state from the node, so
// a sandbox whose processes died shows as dead.
func (s *ControlPlane) GetSandbox(ctx context.Context, c Caller, id string) (_ *node.Sandbox, err error) {
	defer s.done(c, "GetSandbox", &id, &err)
	rec, err := s.load(ctx, c, id)
	if err != nil {
		return nil, err
	}
	if rec.Sandbox.State == node.StateRunning || rec.Sandbox.State == node.StatePaused {
		if updated, err := s.refresh(ctx, rec); err == nil {
			rec = updated
		}
	}
	return s.view(rec), nil
}

// refresh asks the node for a sandbox's state and records a death.
func (s *ControlPlane) refresh(ctx context.Context, rec *sandboxRecord) (*sandboxRecord, error) {
	a, err := s.nodes.Node(rec.Sandbox.Node)
	if err != nil {
		return nil, err
	}
	live, err := a.GetSandbox(ctx, rec.Sandbox.ID)
	reason := ""
	switch {
	case errdefs.IsNotFound(err):
		reason = "the node no longer has this sandbox"
	case err != nil:
		return nil, err
	case live.State == node.StateDead:
		reason = live.Reason
		if reason == "" {
			reason = "its processes died"
		}
	default:
		return rec, nil
	}
	return s.markDead(ctx, rec.Sandbox.ID, reason)
}

func (s *ControlPlane) markDead(ctx context.Context, id, reason string) (*sandboxRecord, error) {
	return s.modify(context.WithoutCancel(ctx), id, func(r *sandboxRecord) error {
		if r.Sandbox.State != node.StateDead {
			s.log.Warn("sandbox is dead", "sandbox", id, "reason", reason)
		}
		r.Sandbox.State, r.Sandbox.Reason = node.StateDead, reason
		return nil
	})
}

// ListSandboxes implements Service. It lists the store's view.
func (s *ControlPlane) ListSandboxes(ctx context.Context, c Caller, f ListFilter) (_ []node.Sandbox, err error) {
	defer s.done(c, "ListSandboxes", nil, &err)
	switch f.State {
	case "", node.StateCreating, node.StateRunning, node.StatePaused, node.StateDead:
	default:
		return nil, invalid("state %q: want creating, running, paused or dead", f.State)
	}
	recs, err := s.listRecords(ctx)
	if err != nil {
		return nil, err
	}
	out := []node.Sandbox{}
	for i := range recs {
		sb := recs[i].Sandbox
		if !c.Admin && sb.Spec.Tenant != c.Tenant {
			continue
		}
		if f.State != "" && sb.State != f.State {
			continue
		}
		match := true
		for k, v := range f.Labels {
			if got, ok := sb.Spec.Labels[k]; !ok || got != v {
				match = false
				break
			}
		}
		if match {
			out = append(out, *s.view(&recs[i]))
		}
	}
	return out, nil
}

// listRecords lists every sandbox record and the creates in flight.
func (s *ControlPlane) listRecords(ctx context.Context) ([]sandboxRecord, error) {
	// In flight first: a create that commits its record meanwhile is then
	// listed twice (once below) rather than not at all.
	creating := s.index.allCreating()
	recs, err := store.ListAll[sandboxRecord](ctx, s.st, store.BucketSandboxes, "")
	if err != nil || len(creating) == 0 {
		return recs, err
	}
	stored := make(map[string]bool, len(recs))
	for i := range recs {
		stored[recs[i].Sandbox.ID] = true
	}
	for _, r := range creating {
		if !stored[r.Sandbox.ID] {
			recs = append(recs, r)
		}
	}
	return recs, nil
}

// DeleteSandbox implements Service.
func (s *ControlPlane) DeleteSandbox(ctx context.Context, c Caller, id string) (err error) {
	defer s.done(c, "DeleteSandbox", &id, &err)
	if _, err := s.load(ctx, c, id); err != nil {
		return err
	}
	return s.destroy(ctx, id, "deleted")
}

// destroy deletes a sandbox on its node and then forgets it. If the node
// call fails the record stays, so nothing leaks unseen.
func (s *ControlPlane) destroy(ctx context.Context, id, reason string) error {
	unlock := s.locks.lock(id)
	defer unlock()
	var rec sandboxRecord
	if err := s.st.Get(ctx, store.BucketSandboxes, id, &rec); err != nil {
		if !errdefs.IsNotFound(err) {
			return err
		}
		if _, ok := s.index.creating(id); !ok {
			return notFound(id)
		}
		rec.Sandbox.State = node.StateCreating
	}
	if rec.Sandbox.State == node.StateCreating {
		return fmt.Errorf("sandbox %s is still being created: %w", id, errdefs.ErrFailedPrecondition)
	}
	if a, err := s.nodes.Node(rec.Sandbox.Node); err == nil {
		if err := ignoreNotFound(a.DeleteSandbox(ctx, id)); err != nil {
			return err
		}
	} else if !errdefs.IsNotFound(err) {
		return err
	}
	if err := s.removeRecord(context.WithoutCancel(ctx), id); err != nil {
		return err
	}
	s.metrics.deletions.WithLabelValues(reason).Inc()
	return nil
}

// PauseSandbox implements Service.
func (s *ControlPlane) PauseSandbox(ctx context.Context, c Caller, id string) (err error) {
	defer s.done(c, "PauseSandbox", &id, &err)
	if _, err := s.load(ctx, c, id); err != nil {
		return err
	}
	return s.transition(ctx, id, node.StateRunning, node.StatePaused)
}

// ResumeSandbox implements Service. Resuming counts as activity, so an
// idle timer does not pause the sandbox again at once.
func (s *ControlPlane) ResumeSandbox(ctx context.Context, c Caller, id string) (err error) {
	defer s.done(c, "ResumeSandbox", &id, &err)
	if _, err := s.load(ctx, c, id); err != nil {
		return err
	}
	if err := s.transition(ctx, id, node.StatePaused, node.StateRunning); err != nil {
		return err
	}
	s.touch(ctx, id)
	return nil
}

func (s *ControlPlane) transition(ctx context.Context, id, from, to string) error {
	unlock := s.locks.lock(id)
	defer unlock()
	var rec sandboxRecord
	if err := s.st.Get(ctx, store.BucketSandboxes, id, &rec); err != nil {
		return err
	}
	if rec.Sandbox.State != from {
		return fmt.Errorf("sandbox %s is %s, not %s: %w", id, rec.Sandbox.State, from, errdefs.ErrFailedPrecondition)
	}
	a, err := s.nodes.Node(rec.Sandbox.Node)
	if err != nil {
		return fmt.Errorf("sandbox %s: node %q: %v: %w", id, rec.Sandbox.Node, err, errdefs.ErrUnavailable)
	}
	if to == node.StatePaused {
		err = a.PauseSandbox(ctx, id)
	} else {
		err = a.ResumeSandbox(ctx, id)
	}
	if errdefs.IsNotFound(err) {
		_, _ = s.markDead(ctx, id, "the node no longer has this sandbox")
		return fmt.Errorf("sandbox %s is dead: %w", id, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return err
	}
	_, err = s.modify(context.WithoutCancel(ctx), id, func(r *sandboxRecord) error {
		r.Sandbox.State = to
		return nil
	})
	return err
}

// SetTimeout implements Service: the sandbox is deleted at now+d.
func (s *ControlPlane) SetTimeout(ctx context.Context, c Caller, id string, d time.Duration) (err error) {
	defer s.done(c, "SetTimeout", &id, &err)
	if err := validTimeout(d); err != nil {
		return err
	}
	if cp := s.cfg.MaxLifetimeCap; cp > 0 && d > cp {
		return invalid("timeout %s exceeds the server's cap of %s", d, cp)
	}
	if _, err := s.load(ctx, c, id); err != nil {
		return err
	}
	unlock := s.locks.lock(id)
	defer unlock()
	deadline := s.now().Add(d)
	_, err = s.modify(ctx, id, func(r *sandboxRecord) error {
		if !holdsResources(r.Sandbox.State) {
			return fmt.Errorf("sandbox %s is %s: %w", id, r.Sandbox.State, errdefs.ErrFailedPrecondition)
		}
		r.Deadline = deadline
		return nil
	})
	return err
}

// SandboxStats implements Service.
func (s *ControlPlane) SandboxStats(ctx context.Context, c Caller, id string) (_ *node.SandboxStats, err error) {
	defer s.done(c, "SandboxStats", &id, &err)
	rec, err := s.load(ctx, c, id)
	if err != nil {
		return nil, err
	}
	a, err := s.nodes.Node(rec.Sandbox.Node)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: node %q: %v: %w", id, rec.Sandbox.Node, err, errdefs.ErrUnavailable)
	}
	return a.SandboxStats(ctx, id)
}

// SetNetwork implements Service.
func (s *ControlPlane) SetNetwork(ctx context.Context, c Caller, id string, p node.NetworkPolicy) (err error) {
	defer s.done(c, "SetNetwork", &id, &err)
	if err := validPolicy(p); err != nil {
		return err
	}
	if _, err := s.load(ctx, c, id); err != nil {
		return err
	}
	unlock := s.locks.lock(id)
	defer unlock()
	rec, err := s.load(ctx, c, id)
	if err != nil {
		return err
	}
	a, err := s.nodes.Node(rec.Sandbox.Node)
	if err != nil {
		return fmt.Errorf("sandbox %s: node %q: %v: %w", id, rec.Sandbox.Node, err, errdefs.ErrUnavailable)
	}
	if err := a.SetNetwork(ctx, id, p); err != nil {
		return err
	}
	_, err = s.modify(context.WithoutCancel(ctx), id, func(r *sandboxRecord) error {
		r.Sandbox.Spec.Network = p
		return nil
	})
	return err
}

// Snapshot implements Service: the node commits the sandbox's private
// layer as a new image version, owned by the sandbox's tenant.
func (s *ControlPlane) Snapshot(ctx context.Context, c Caller, id, imageRef string) (_ *ImageInfo, err error) {
	defer s.done(c, "Snapshot", &id, &err)
	ref, err := normRef(imageRef)
	if err != nil {
		return nil, err
	}
	rec, err := s.load(ctx, c, id)
	if err != nil {
		return nil, err
	}
	tenant := rec.Sandbox.Spec.Tenant
	a, err := s.nodes.Node(rec.Sandbox.Node)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: node %q: %v: %w", id, rec.Sandbox.Node, err, errdefs.ErrUnavailable)
	}
	release, err := s.claimImageName(ctx, tenant, ref, false)
	if err != nil {
		return nil, err
	}
	got, err := a.Snapshot(ctx, id, ref)
	if err != nil {
		release()
		return nil, err
	}
	info := &ImageInfo{Name: ref, Digest: got, CreatedAt: s.now()}
	if s.images != nil {
		if resolved, err := s.images.Resolve(ctx, ref); err == nil {
			info = resolved
		} else {
			s.log.Warn("resolving a fresh snapshot", "image", ref, "err", err)
		}
	}
	return s.withACL(ctx, info)
}

// Fork implements Service: count new sandboxes start from a copy of id's
// file system, with its spec. It is all or nothing.
func (s *ControlPlane) Fork(ctx context.Context, c Caller, id string, count int) (_ []node.Sandbox, err error) {
	defer s.done(c, "Fork", &id, &err)
	if count < 1 || count > s.cfg.MaxFork {
		return nil, invalid("fork count %d: want 1 to %d", count, s.cfg.MaxFork)
	}
	src, err := s.load(ctx, c, id)
	if err != nil {
		return nil, err
	}
	owner := Caller{Tenant: src.Sandbox.Spec.Tenant, Admin: c.Admin, TokenID: c.TokenID}
	var out []node.Sandbox
	// One group per request: the node commits the source once and every
	// fork starts from that same point in time.
	group := newForkGroup()
	for i := 0; i < count; i++ {
		spec := src.Sandbox.Spec
		spec.ID, spec.FromSandbox, spec.ForkGroup = "", id, group
		spec.Labels = maps.Clone(spec.Labels)
		sb, err := s.create(ctx, owner, &spec)
		if err != nil {
			for _, done := range out {
				if derr := s.destroy(context.WithoutCancel(ctx), done.ID, "fork rolled back"); derr != nil {
					s.log.Error("rolling back a fork", "sandbox", done.ID, "err", derr)
				}
			}
			return nil, fmt.Errorf("fork %d of %d: %w", i+1, count, err)
		}
		out = append(out, *sb)
	}
	return out, nil
}

func newForkGroup() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
