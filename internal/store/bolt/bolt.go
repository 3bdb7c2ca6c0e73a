package bolt

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	bbolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/store"
)

// DefaultFile is the database file name inside the data dir.
const DefaultFile = "state.db"

var _ store.Store = (*Store)(nil)

// Store is a bbolt-backed store.Store.
//
// Writes are group-committed: one goroutine commits them, and every Update
// that arrives while a commit is in flight joins the next one, so that
// concurrent writers (creates and deletes of sandboxes) share one fsync
// instead of queueing for one each. An update waits for no timer: alone,
// it is committed at once. The functions of one commit run one after the
// other in one bbolt transaction; when one fails, the transaction is rolled
// back, that update fails alone with its error and the others run again
// without it (which is why store.Update's fn may run more than once).
type Store struct {
	db *bbolt.DB

	mu      sync.Mutex
	queue   []*update     // waiting for the next commit
	wake    chan struct{} // a token: the queue has work
	closed  bool
	stopped chan struct{} // closed when the committer has exited
}

// update is one Update waiting for its commit.
type update struct {
	ctx  context.Context
	fn   func(store.Tx) error
	done chan error
}

// errMemberFailed rolls back a group commit when one of its updates fails.
var errMemberFailed = errors.New("store: an update of the group failed")

type config struct {
	lockTimeout time.Duration
	noSync      bool
}

// Opt configures Open.
type Opt func(*config)

// WithLockTimeout bounds how long Open waits for another process holding
// the database file lock (default 2s); a second server on the same data
// dir then fails instead of hanging.
func WithLockTimeout(d time.Duration) Opt { return func(c *config) { c.lockTimeout = d } }

// WithNoSync skips fsync on commit: for tests only, a crash may lose the
// last commits.
func WithNoSync() Opt { return func(c *config) { c.noSync = true } }

// Open opens (creating if needed) the database at path.
func Open(path string, opts ...Opt) (*Store, error) {
	cfg := config{lockTimeout: 2 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("store: create dir for %s: %w", path, err)
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: cfg.lockTimeout, NoSync: cfg.noSync})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("store: %s is locked by another process: %w", path, errdefs.ErrUnavailable)
		}
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	st := &Store{db: db, wake: make(chan struct{}, 1), stopped: make(chan struct{})}
	go st.commitLoop()
	return st, nil
}

// Close commits the updates already queued and closes the database.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return s.db.Close()
	}
	s.closed = true
	close(s.wake)
	s.mu.Unlock()
	<-s.stopped
	return s.db.Close()
}

// commitLoop commits the queued updates, all of those queued at a time in
// one transaction, until Close.
func (s *Store) commitLoop() {
	defer close(s.stopped)
	for range s.wake {
		for {
			s.mu.Lock()
			batch := s.queue
			s.queue = nil
			s.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			s.commit(batch)
		}
	}
}

// commit runs batch in one transaction and tells each update its result.
func (s *Store) commit(batch []*update) {
	for len(batch) > 0 {
		failed, failure := -1, error(nil)
		err := s.db.Update(func(tx *bbolt.Tx) error {
			for i, u := range batch {
				err := u.ctx.Err()
				if err == nil {
					t := &boltTx{tx: tx}
					err = u.fn(t)
					t.done = true
				}
				if err != nil {
					failed, failure = i, err
					return errMemberFailed
				}
			}
			return nil
		})
		if failed < 0 {
			for _, u := range batch {
				u.done <- err // nil, or the commit's error for all
			}
			return
		}
		// Its writes, and those before it, are rolled back: it fails,
		// the rest run again.
		batch[failed].done <- failure
		batch = slices.Delete(batch, failed, failed+1)
	}
}

// enqueue hands fn to the committer and waits for its commit.
func (s *Store) enqueue(ctx context.Context, fn func(store.Tx) error) error {
	u := &update{ctx: ctx, fn: fn, done: make(chan error, 1)}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("store: %w", berrors.ErrDatabaseNotOpen)
	}
	s.queue = append(s.queue, u)
	select {
	case s.wake <- struct{}{}:
	default: // a token is pending already
	}
	s.mu.Unlock()
	return <-u.done
}

// Get implements store.Reader.
func (s *Store) Get(ctx context.Context, bucket, key string, v any) error {
	if err := precheck(ctx, bucket, key); err != nil {
		return err
	}
	return s.db.View(func(tx *bbolt.Tx) error { return get(tx, bucket, key, v) })
}

// List implements store.Reader.
func (s *Store) List(ctx context.Context, bucket, prefix string, fn func(string, []byte) error) error {
	if err := precheck(ctx, bucket, "-"); err != nil {
		return err
	}
	return s.db.View(func(tx *bbolt.Tx) error { return list(ctx, tx, bucket, prefix, fn) })
}

// Put implements store.Writer.
func (s *Store) Put(ctx context.Context, bucket, key string, v any) error {
	if err := precheck(ctx, bucket, key); err != nil {
		return err
	}
	b, err := store.Encode(v)
	if err != nil {
		return err
	}
	return s.enqueue(ctx, func(t store.Tx) error { return put(t.(*boltTx).tx, bucket, key, b) })
}

// Delete implements store.Writer.
func (s *Store) Delete(ctx context.Context, bucket, key string) error {
	if err := precheck(ctx, bucket, key); err != nil {
		return err
	}
	return s.enqueue(ctx, func(t store.Tx) error { return del(t.(*boltTx).tx, bucket, key) })
}

// Update implements store.Store. fn may run more than once (see Store).
func (s *Store) Update(ctx context.Context, fn func(store.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.enqueue(ctx, fn)
}

type boltTx struct {
	tx   *bbolt.Tx
	done bool
}

func (t *boltTx) check(ctx context.Context, bucket, key string) error {
	if t.done {
		return fmt.Errorf("store: transaction used after Update returned: %w", errdefs.ErrFailedPrecondition)
	}
	return precheck(ctx, bucket, key)
}

func (t *boltTx) Get(ctx context.Context, bucket, key string, v any) error {
	if err := t.check(ctx, bucket, key); err != nil {
		return err
	}
	return get(t.tx, bucket, key, v)
}

func (t *boltTx) List(ctx context.Context, bucket, prefix string, fn func(string, []byte) error) error {
	if err := t.check(ctx, bucket, "-"); err != nil {
		return err
	}
	return list(ctx, t.tx, bucket, prefix, fn)
}

func (t *boltTx) Put(ctx context.Context, bucket, key string, v any) error {
	if err := t.check(ctx, bucket, key); err != nil {
		return err
	}
	b, err := store.Encode(v)
	if err != nil {
		return err
	}
	return put(t.tx, bucket, key, b)
}

func (t *boltTx) Delete(ctx context.Context, bucket, key string) error {
	if err := t.check(ctx, bucket, key); err != nil {
		return err
	}
	return del(t.tx, bucket, key)
}

func precheck(ctx context.Context, bucket, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return store.CheckKey(bucket, key)
}

func get(tx *bbolt.Tx, bucket, key string, v any) error {
	b := tx.Bucket([]byte(bucket))
	var raw []byte
	if b != nil {
		raw = b.Get([]byte(key))
	}
	if raw == nil {
		return fmt.Errorf("store: %s/%s: %w", bucket, key, errdefs.ErrNotFound)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("store: decode %s/%s: %w", bucket, key, err)
	}
	return nil
}

func list(ctx context.Context, tx *bbolt.Tx, bucket, prefix string, fn func(string, []byte) error) error {
	b := tx.Bucket([]byte(bucket))
	if b == nil {
		return nil
	}
	c := b.Cursor()
	p := []byte(prefix)
	for k, v := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, v = c.Next() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(string(k), v); err != nil {
			return err
		}
	}
	return nil
}

func put(tx *bbolt.Tx, bucket, key string, value []byte) error {
	b, err := tx.CreateBucketIfNotExists([]byte(bucket))
	if err != nil {
		return fmt.Errorf("store: bucket %s: %w", bucket, err)
	}
	if err := b.Put([]byte(key), value); err != nil {
		return fmt.Errorf("store: put %s/%s: %w", bucket, key, err)
	}
	return nil
}

func del(tx *bbolt.Tx, bucket, key string) error {
	b := tx.Bucket([]byte(bucket))
	if b == nil || b.Get([]byte(key)) == nil {
		return fmt.Errorf("store: %s/%s: %w", bucket, key, errdefs.ErrNotFound)
	}
	return b.Delete([]byte(key))
}
