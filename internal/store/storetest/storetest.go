package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/store"
)

// Factory returns a new, empty store; the suite closes it.
type Factory func(t *testing.T) store.Store

type rec struct {
	Name  string `json:"name"`
	Count int    `json:"count"`
}

// Run runs the whole suite against stores made by newStore.
func Run(t *testing.T, newStore Factory) {
	tests := map[string]func(*testing.T, store.Store){
		"PutGet":                testPutGet,
		"GetMissing":            testGetMissing,
		"Overwrite":             testOverwrite,
		"Delete":                testDelete,
		"ListPrefixOrdered":     testListPrefix,
		"ListStopsOnError":      testListStop,
		"BucketsAreSeparate":    testBucketsSeparate,
		"BadInput":              testBadInput,
		"UpdateAtomic":          testUpdateAtomic,
		"UpdateReadsOwnWrites":  testUpdateReadsOwnWrites,
		"UpdateSerialisable":    testUpdateSerialisable,
		"CancelledContext":      testCancelled,
		"TxUnusableAfterUpdate": testTxAfterUpdate,
	}
	for name, fn := range tests {
		t.Run(name, func(t *testing.T) {
			s := newStore(t)
			t.Cleanup(func() { _ = s.Close() })
			fn(t, s)
		})
	}
}

func testPutGet(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.Put(ctx, "b", "k", rec{Name: "a", Count: 3}); err != nil {
		t.Fatal(err)
	}
	var got rec
	if err := s.Get(ctx, "b", "k", &got); err != nil {
		t.Fatal(err)
	}
	if got != (rec{Name: "a", Count: 3}) {
		t.Fatalf("got %+v", got)
	}
}

func testGetMissing(t *testing.T, s store.Store) {
	ctx := context.Background()
	var got rec
	if err := s.Get(ctx, "never-written", "k", &got); !errdefs.IsNotFound(err) {
		t.Fatalf("missing bucket: want not found, got %v", err)
	}
	if err := s.Put(ctx, "b", "other", rec{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Get(ctx, "b", "k", &got); !errdefs.IsNotFound(err) {
		t.Fatalf("missing key: want not found, got %v", err)
	}
}

func testOverwrite(t *testing.T, s store.Store) {
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if err := s.Put(ctx, "b", "k", rec{Count: i}); err != nil {
			t.Fatal(err)
		}
	}
	var got rec
	if err := s.Get(ctx, "b", "k", &got); err != nil || got.Count != 2 {
		t.Fatalf("got %+v, %v", got, err)
	}
}

func testDelete(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.Put(ctx, "b", "k", rec{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "b", "k"); err != nil {
		t.Fatal(err)
	}
	var got rec
	if err := s.Get(ctx, "b", "k", &got); !errdefs.IsNotFound(err) {
		t.Fatalf("after delete: want not found, got %v", err)
	}
	if err := s.Delete(ctx, "b", "k"); !errdefs.IsNotFound(err) {
		t.Fatalf("delete missing: want not found, got %v", err)
	}
	if err := s.Delete(ctx, "no-bucket", "k"); !errdefs.IsNotFound(err) {
		t.Fatalf("delete in missing bucket: want not found, got %v", err)
	}
}

func testListPrefix(t *testing.T, s store.Store) {
	ctx := context.Background()
	for _, k := range []string{"sb2/e1", "sb1/e2", "sb1/e1", "sb10/e1", "sb1", "sa/x"} {
		if err := s.Put(ctx, "execs", k, rec{Name: k}); err != nil {
			t.Fatal(err)
		}
	}
	var keys []string
	err := s.List(ctx, "execs", "sb1/", func(k string, v []byte) error {
		keys = append(keys, k)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(keys) != "[sb1/e1 sb1/e2]" {
		t.Fatalf("prefix sb1/: got %v", keys)
	}
	all, err := store.ListAll[rec](ctx, s, "execs", "")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range all {
		names = append(names, r.Name)
	}
	if fmt.Sprint(names) != "[sa/x sb1 sb1/e1 sb1/e2 sb10/e1 sb2/e1]" {
		t.Fatalf("all, ordered: got %v", names)
	}
	empty, err := store.ListAll[rec](ctx, s, "never-written", "")
	if err != nil || len(empty) != 0 {
		t.Fatalf("missing bucket: got %v, %v", empty, err)
	}
}

func testListStop(t *testing.T, s store.Store) {
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		if err := s.Put(ctx, "b", k, rec{}); err != nil {
			t.Fatal(err)
		}
	}
	stop := errors.New("stop")
	n := 0
	err := s.List(ctx, "b", "", func(string, []byte) error {
		n++
		if n == 2 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || n != 2 {
		t.Fatalf("want stop after 2, got n=%d err=%v", n, err)
	}
}

func testBucketsSeparate(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.Put(ctx, "one", "k", rec{Count: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "two", "k", rec{Count: 2}); err != nil {
		t.Fatal(err)
	}
	var a, b rec
	if err := s.Get(ctx, "one", "k", &a); err != nil {
		t.Fatal(err)
	}
	if err := s.Get(ctx, "two", "k", &b); err != nil {
		t.Fatal(err)
	}
	if a.Count != 1 || b.Count != 2 {
		t.Fatalf("buckets leak: %+v %+v", a, b)
	}
}

func testBadInput(t *testing.T, s store.Store) {
	ctx := context.Background()
	var v rec
	cases := []struct {
		name string
		err  error
	}{
		{"put empty bucket", s.Put(ctx, "", "k", rec{})},
		{"put empty key", s.Put(ctx, "b", "", rec{})},
		{"put NUL key", s.Put(ctx, "b", "a\x00b", rec{})},
		{"get empty key", s.Get(ctx, "b", "", &v)},
		{"delete empty bucket", s.Delete(ctx, "", "k")},
		{"list empty bucket", s.List(ctx, "", "", func(string, []byte) error { return nil })},
		{"put unencodable", s.Put(ctx, "b", "k", make(chan int))},
	}
	for _, c := range cases {
		if !errdefs.IsInvalidArgument(c.err) {
			t.Errorf("%s: want invalid argument, got %v", c.name, c.err)
		}
	}
	// Nothing of the refused writes landed.
	n := 0
	_ = s.List(ctx, "b", "", func(string, []byte) error { n++; return nil })
	if n != 0 {
		t.Fatalf("refused writes left %d keys", n)
	}
	// A value of the wrong shape is a decode error, not a silent zero.
	if err := s.Put(ctx, "b", "str", "just a string"); err != nil {
		t.Fatal(err)
	}
	if err := s.Get(ctx, "b", "str", &v); err == nil {
		t.Fatal("decoding a string into a struct succeeded")
	}
}

func testUpdateAtomic(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.Put(ctx, "b", "keep", rec{Count: 1}); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := s.Update(ctx, func(tx store.Tx) error {
		if err := tx.Put(ctx, "b", "new", rec{Count: 9}); err != nil {
			return err
		}
		if err := tx.Put(ctx, "b", "keep", rec{Count: 9}); err != nil {
			return err
		}
		if err := tx.Delete(ctx, "b", "keep"); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("want boom, got %v", err)
	}
	var got rec
	if err := s.Get(ctx, "b", "new", &got); !errdefs.IsNotFound(err) {
		t.Fatalf("rolled-back put is visible: %v %+v", err, got)
	}
	if err := s.Get(ctx, "b", "keep", &got); err != nil || got.Count != 1 {
		t.Fatalf("rolled-back overwrite/delete is visible: %v %+v", err, got)
	}
}

func testUpdateReadsOwnWrites(t *testing.T, s store.Store) {
	ctx := context.Background()
	err := s.Update(ctx, func(tx store.Tx) error {
		if err := tx.Put(ctx, "b", "x/1", rec{Count: 1}); err != nil {
			return err
		}
		if err := tx.Put(ctx, "b", "x/2", rec{Count: 2}); err != nil {
			return err
		}
		var r rec
		if err := tx.Get(ctx, "b", "x/1", &r); err != nil || r.Count != 1 {
			return fmt.Errorf("own write not visible: %v %+v", err, r)
		}
		all, err := store.ListAll[rec](ctx, tx, "b", "x/")
		if err != nil || len(all) != 2 {
			return fmt.Errorf("own writes not listed: %v %+v", err, all)
		}
		return tx.Delete(ctx, "b", "x/2")
	})
	if err != nil {
		t.Fatal(err)
	}
	all, err := store.ListAll[rec](ctx, s, "b", "x/")
	if err != nil || len(all) != 1 || all[0].Count != 1 {
		t.Fatalf("after commit: %v %+v", err, all)
	}
}

// testUpdateSerialisable runs concurrent read-modify-write Updates: with
// serialisable transactions no increment is lost, and a capped counter
// (the shape of a quota check) never overshoots.
func testUpdateSerialisable(t *testing.T, s store.Store) {
	ctx := context.Background()
	const workers, per, limit = 8, 25, 100
	var wg sync.WaitGroup
	var mu sync.Mutex
	granted := 0
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				err := s.Update(ctx, func(tx store.Tx) error {
					var c rec
					if err := tx.Get(ctx, "b", "counter", &c); err != nil && !errdefs.IsNotFound(err) {
						return err
					}
					if c.Count >= limit {
						return errdefs.ErrResourceExhausted
					}
					c.Count++
					return tx.Put(ctx, "b", "counter", c)
				})
				if err == nil {
					mu.Lock()
					granted++
					mu.Unlock()
				} else if !errdefs.IsResourceExhausted(err) {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	var c rec
	if err := s.Get(ctx, "b", "counter", &c); err != nil {
		t.Fatal(err)
	}
	if c.Count != limit || granted != limit {
		t.Fatalf("counter=%d granted=%d, want both %d", c.Count, granted, limit)
	}
}

func testCancelled(t *testing.T, s store.Store) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var v rec
	if err := s.Put(ctx, "b", "k", rec{}); !errors.Is(err, context.Canceled) {
		t.Errorf("put: %v", err)
	}
	if err := s.Get(ctx, "b", "k", &v); !errors.Is(err, context.Canceled) {
		t.Errorf("get: %v", err)
	}
	ran := false
	if err := s.Update(ctx, func(store.Tx) error { ran = true; return nil }); !errors.Is(err, context.Canceled) || ran {
		t.Errorf("update: ran=%v err=%v", ran, err)
	}
	if err := s.Get(context.Background(), "b", "k", &v); !errdefs.IsNotFound(err) {
		t.Errorf("cancelled put landed: %v", err)
	}
}

func testTxAfterUpdate(t *testing.T, s store.Store) {
	ctx := context.Background()
	var leaked store.Tx
	if err := s.Update(ctx, func(tx store.Tx) error { leaked = tx; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := leaked.Put(ctx, "b", "k", rec{}); err == nil {
		t.Fatal("put on a finished transaction succeeded")
	}
}
