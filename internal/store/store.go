package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Buckets used by the control plane. A backend creates a bucket on first
// write; reading a bucket that was never written is simply empty.
const (
	BucketSandboxes   = "sandboxes"
	BucketTenants     = "tenants"
	BucketTokens      = "tokens"
	BucketTokenHashes = "token-hashes"
	BucketImageACL    = "images-acl"
	BucketExecs       = "execs"
)

// Reader reads values.
type Reader interface {
	// Get decodes the JSON value under (bucket, key) into v. A missing key
	// is an errdefs.ErrNotFound-wrapped error.
	Get(ctx context.Context, bucket, key string, v any) error
	// List calls fn for every key in bucket starting with prefix, in
	// ascending key order, with the raw JSON value. value is valid only
	// during the call. An error from fn stops the walk and is returned.
	List(ctx context.Context, bucket, prefix string, fn func(key string, value []byte) error) error
}

// Writer writes values.
type Writer interface {
	// Put stores v encoded as JSON under (bucket, key), replacing any value.
	Put(ctx context.Context, bucket, key string, v any) error
	// Delete removes (bucket, key). A missing key is ErrNotFound.
	Delete(ctx context.Context, bucket, key string) error
}

// Tx is a read-write transaction. It must not be used after the function
// given to Update returns.
type Tx interface {
	Reader
	Writer
}

// Store is a state store. Single calls are atomic; Update groups several.
type Store interface {
	Reader
	Writer
	// Update runs fn in one serialisable read-write transaction: either
	// all of its writes land or, when fn (or the commit) fails, none.
	// Concurrent Updates behave as if run one after the other, so a
	// check-then-write inside fn cannot race with another Update.
	//
	// fn may run more than once: a backend may commit concurrent updates
	// together and run them again when one of them fails. So fn must
	// leave no effect outside tx but idempotent ones (setting a variable
	// of the caller, not appending to it), and only a nil return of
	// Update says that what its last run did was committed.
	Update(ctx context.Context, fn func(tx Tx) error) error
	Close() error
}

// CheckKey validates a bucket and key; backends call it on every access
// so that bad input is refused the same way everywhere.
func CheckKey(bucket, key string) error {
	if bucket == "" {
		return fmt.Errorf("store: empty bucket name: %w", errdefs.ErrInvalidArgument)
	}
	if key == "" {
		return fmt.Errorf("store: empty key in bucket %q: %w", bucket, errdefs.ErrInvalidArgument)
	}
	if strings.IndexByte(bucket, 0) >= 0 || strings.IndexByte(key, 0) >= 0 {
		return fmt.Errorf("store: NUL byte in bucket or key: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// Encode marshals a value for storage, classifying failures.
func Encode(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("store: encode value: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return b, nil
}

// ListAll decodes every value in bucket under prefix into a slice.
func ListAll[T any](ctx context.Context, r Reader, bucket, prefix string) ([]T, error) {
	var out []T
	err := r.List(ctx, bucket, prefix, func(key string, value []byte) error {
		var v T
		if err := json.Unmarshal(value, &v); err != nil {
			return fmt.Errorf("store: decode %s/%s: %w", bucket, key, err)
		}
		out = append(out, v)
		return nil
	})
	return out, err
}
