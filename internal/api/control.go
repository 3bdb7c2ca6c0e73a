package api

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/store"
)

var _ Service = (*ControlPlane)(nil)

// ControlPlane implements Service over a state store and a set of nodes.
type ControlPlane struct {
	cfg     Config
	st      store.Store
	nodes   NodeSet
	images  ImageManager
	log     *slog.Logger
	audit   *auditLog
	metrics *metrics
	locks   keyedLocks
	// index summarises every sandbox record and the creates in flight
	// (quota usage, timers) in memory.
	index *sandboxIndex
	// tenantMu: creates hold it shared while they reserve, DeleteTenant
	// exclusively, so no sandbox is reserved for a tenant being deleted.
	tenantMu sync.RWMutex

	actMu     sync.Mutex
	activity  map[string]time.Time // last activity seen, by sandbox
	persisted map[string]time.Time // last activity written to the store

	execs execResults // finished execs not yet in the store

	bg      context.Context
	stop    context.CancelFunc
	wg      sync.WaitGroup
	started sync.Once
}

// sandboxRecord is what the store keeps per sandbox: the last known node
// view (its Spec carries tenant and reserved resources) and the lifetime
// deadline, persisted so timers survive a restart.
type sandboxRecord struct {
	Sandbox  node.Sandbox `json:"sandbox"`
	Deadline time.Time    `json:"deadline,omitzero"`
}

// NewService builds the control plane. images may be nil: image calls
// then fail with ErrNotImplemented and sandbox images are not checked for
// existence (the node still resolves them). Call Start before serving.
func NewService(cfg Config, st store.Store, nodes NodeSet, images ImageManager, logger *slog.Logger) (*ControlPlane, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if st == nil || nodes == nil {
		return nil, fmt.Errorf("api: a store and a node set are required: %w", errdefs.ErrInvalidArgument)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("api: data dir: %w", err)
	}
	al, err := openAuditLog(cfg.DataDir, cfg.AuditMaxBytes, cfg.AuditKeep)
	if err != nil {
		return nil, err
	}
	bg, stop := context.WithCancel(context.Background())
	s := &ControlPlane{
		cfg: cfg, st: st, nodes: nodes, images: images, log: logger, audit: al,
		locks:    keyedLocks{m: map[string]*keyedLock{}},
		activity: map[string]time.Time{}, persisted: map[string]time.Time{},
		bg: bg, stop: stop,
	}
	s.metrics = newMetrics(s)
	s.index = newSandboxIndex()
	if err := s.index.load(context.Background(), st); err != nil {
		_ = al.Close()
		return nil, fmt.Errorf("api: index sandbox records: %w", err)
	}
	return s, nil
}

// Registry returns the Prometheus registry holding the control plane's
// metrics; give it to NewHandler with WithMetricsRegistry.
func (s *ControlPlane) Registry() *prometheus.Registry { return s.metrics.reg }

// Start reconciles the store with what the nodes report and starts the
// lifecycle timer loop. It returns after reconciliation.
func (s *ControlPlane) Start(ctx context.Context) error {
	if err := s.ensureAdminTenant(ctx); err != nil {
		return err
	}
	if err := s.Reconcile(ctx); err != nil {
		return err
	}
	s.started.Do(func() {
		s.wg.Add(1)
		go s.reapLoop()
	})
	return nil
}

// Close stops timers and exec watchers and closes the audit log. It does
// not close the store or touch sandboxes: they keep running for the next
// server to adopt.
func (s *ControlPlane) Close() error {
	s.stop()
	s.wg.Wait()
	s.flushExecs(context.Background())
	return s.audit.Close()
}

func (s *ControlPlane) ensureAdminTenant(ctx context.Context) error {
	return s.st.Update(ctx, func(tx store.Tx) error {
		var t Tenant
		err := tx.Get(ctx, store.BucketTenants, AdminTenant, &t)
		if err == nil || !errdefs.IsNotFound(err) {
			return err
		}
		return tx.Put(ctx, store.BucketTenants, AdminTenant, Tenant{Name: AdminTenant, CreatedAt: s.now(), Admin: true})
	})
}

func (s *ControlPlane) now() time.Time { return s.cfg.Clock.Now() }

// done writes the audit line of one call; id may change during the call
// (a created sandbox's id), hence the pointers.
func (s *ControlPlane) done(c Caller, method string, id *string, err *error) {
	sid := ""
	if id != nil {
		sid = *id
	}
	s.audit.Record(s.now(), c, method, sid, *err)
	if *err != nil {
		s.log.Debug("api call failed", "method", method, "tenant", c.Tenant, "sandbox", sid, "err", *err)
	}
}

// nodeCtx bounds a call the control plane makes on its own behalf.
func (s *ControlPlane) nodeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), s.cfg.NodeTimeout)
}

func notFound(id string) error {
	return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
}

// load returns the record of a sandbox the caller may see. Another
// tenant's sandbox is reported exactly like a missing one.
func (s *ControlPlane) load(ctx context.Context, c Caller, id string) (*sandboxRecord, error) {
	if err := validID("sandbox id", id); err != nil {
		return nil, err
	}
	var rec sandboxRecord
	if err := s.st.Get(ctx, store.BucketSandboxes, id, &rec); err != nil {
		if !errdefs.IsNotFound(err) {
			return nil, err
		}
		creating, ok := s.index.creating(id)
		if !ok {
			return nil, notFound(id)
		}
		rec = *creating
	}
	if !c.Admin && rec.Sandbox.Spec.Tenant != c.Tenant {
		return nil, notFound(id)
	}
	return &rec, nil
}

// loadLive is load plus a check that the sandbox can take exec and file
// calls.
func (s *ControlPlane) loadLive(ctx context.Context, c Caller, id string) (*sandboxRecord, node.Agent, error) {
	rec, err := s.load(ctx, c, id)
	if err != nil {
		return nil, nil, err
	}
	switch rec.Sandbox.State {
	case node.StateRunning:
	case node.StatePaused:
		return nil, nil, fmt.Errorf("sandbox %s is paused; resume it first: %w", id, errdefs.ErrFailedPrecondition)
	default:
		return nil, nil, fmt.Errorf("sandbox %s is %s: %w", id, rec.Sandbox.State, errdefs.ErrFailedPrecondition)
	}
	a, err := s.nodes.Node(rec.Sandbox.Node)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: its node %q is unknown: %v: %w", id, rec.Sandbox.Node, err, errdefs.ErrUnavailable)
	}
	return rec, a, nil
}

// modify applies fn to a stored record in one transaction.
func (s *ControlPlane) modify(ctx context.Context, id string, fn func(*sandboxRecord) error) (*sandboxRecord, error) {
	var out sandboxRecord
	indexed := false
	err := s.st.Update(ctx, func(tx store.Tx) error {
		if err := tx.Get(ctx, store.BucketSandboxes, id, &out); err != nil {
			if errdefs.IsNotFound(err) {
				return notFound(id)
			}
			return err
		}
		if err := fn(&out); err != nil {
			return err
		}
		if err := tx.Put(ctx, store.BucketSandboxes, id, &out); err != nil {
			return err
		}
		s.index.put(&out)
		indexed = true
		return nil
	})
	if err != nil {
		if indexed { // the commit failed
			s.index.resync(ctx, s.st, id)
		}
		return nil, err
	}
	return &out, nil
}

// removeRecord forgets a sandbox and its exec results.
func (s *ControlPlane) removeRecord(ctx context.Context, id string) error {
	err := s.st.Update(ctx, func(tx store.Tx) error {
		var keys []string
		if err := tx.List(ctx, store.BucketExecs, id+"/", func(k string, _ []byte) error {
			keys = append(keys, k)
			return nil
		}); err != nil {
			return err
		}
		for _, k := range keys {
			if err := tx.Delete(ctx, store.BucketExecs, k); err != nil {
				return err
			}
		}
		err := tx.Delete(ctx, store.BucketSandboxes, id)
		if err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		s.index.remove(id)
		return nil
	})
	s.forgetExecCount(id)
	if err != nil {
		s.index.resync(ctx, s.st, id)
	}
	s.actMu.Lock()
	delete(s.activity, id)
	delete(s.persisted, id)
	s.actMu.Unlock()
	return err
}

// touch records activity on a sandbox (any exec or file call). It is kept
// in memory and persisted at most every ActivityPersistEvery.
func (s *ControlPlane) touch(ctx context.Context, id string) {
	now := s.now()
	s.actMu.Lock()
	if now.After(s.activity[id]) {
		s.activity[id] = now
	}
	stale := now.Sub(s.persisted[id]) >= s.cfg.ActivityPersistEvery
	if stale {
		s.persisted[id] = now
	}
	s.actMu.Unlock()
	if !stale {
		return
	}
	_, err := s.modify(context.WithoutCancel(ctx), id, func(r *sandboxRecord) error {
		if now.After(r.Sandbox.LastActivity) {
			r.Sandbox.LastActivity = now
		}
		return nil
	})
	if err != nil && !errdefs.IsNotFound(err) {
		s.log.Warn("persisting sandbox activity", "sandbox", id, "err", err)
	}
}

// memoryActivity is the last activity seen in memory (zero if none).
func (s *ControlPlane) memoryActivity(id string) time.Time {
	s.actMu.Lock()
	defer s.actMu.Unlock()
	return s.activity[id]
}

// lastActivity is the latest of the in-memory and the persisted activity.
func (s *ControlPlane) lastActivity(rec *sandboxRecord) time.Time {
	s.actMu.Lock()
	t := s.activity[rec.Sandbox.ID]
	s.actMu.Unlock()
	if rec.Sandbox.LastActivity.After(t) {
		return rec.Sandbox.LastActivity
	}
	return t
}

// view is the caller-facing Sandbox of a record.
func (s *ControlPlane) view(rec *sandboxRecord) *node.Sandbox {
	sb := rec.Sandbox
	sb.LastActivity = s.lastActivity(rec)
	return &sb
}

// keyedLocks serialises lifecycle changes (delete, pause, resume, timers)
// of one sandbox without a global lock.
type keyedLocks struct {
	mu sync.Mutex
	m  map[string]*keyedLock
}

type keyedLock struct {
	mu   sync.Mutex
	refs int
}

func (k *keyedLocks) lock(key string) func() {
	k.mu.Lock()
	l := k.m[key]
	if l == nil {
		l = &keyedLock{}
		k.m[key] = l
	}
	l.refs++
	k.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		k.mu.Lock()
		l.refs--
		if l.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}

// ignoreNotFound treats a missing object as already gone.
func ignoreNotFound(err error) error {
	if errdefs.IsNotFound(err) {
		return nil
	}
	return err
}
