package store

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	bolt "go.etcd.io/bbolt"

	"github.com/cocoonstack/cocoon-cri/pkg/faultpoint"
)

// Table is one bucket of records of type T, mirrored in memory. Records handed out are copies;
// the CRI configs they point to are shared and must be treated as read-only.
type Table[T any] struct {
	db     *bolt.DB
	bucket []byte
	what   string // a record's name in errors: "sandbox"
	key    func(*T) string
	unique func(*T) []string
	clone  func(*T) *T

	// writeMu serialises transactions, so a transaction reads a committed state nobody else changes.
	writeMu sync.Mutex
	// mu guards the mirror; it is held only to copy in or out, never across a disk sync.
	mu    sync.RWMutex
	items map[string]*T
	index map[string]string // unique key -> record key
}

func newTable[T any](db *bolt.DB, bucket, what string, key func(*T) string, unique func(*T) []string, clone func(*T) *T) *Table[T] {
	return &Table[T]{
		db: db, bucket: []byte(bucket), what: what, key: key, unique: unique, clone: clone,
		items: map[string]*T{}, index: map[string]string{},
	}
}

func (t *Table[T]) createBucket(tx *bolt.Tx) error {
	_, err := tx.CreateBucketIfNotExists(t.bucket)
	return err
}

// load mirrors the bucket in memory. A record that cannot be decoded is moved to the quarantine
// bucket rather than stop the daemon from starting: one bad record must not take down every pod.
// It returns what it moved.
func (t *Table[T]) load(tx *bolt.Tx) ([]Quarantined, error) {
	b := tx.Bucket(t.bucket)
	var bad []Quarantined
	err := b.ForEach(func(k, v []byte) error {
		item := new(T)
		if err := decode(v, item); err != nil {
			bad = append(bad, Quarantined{Table: string(t.bucket), Key: string(k), Err: err.Error()})
			return nil
		}
		t.items[string(k)] = item
		for _, u := range t.unique(item) {
			t.index[u] = string(k)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(bad) == 0 {
		return nil, nil
	}
	q, err := tx.CreateBucketIfNotExists(quarantineBucket)
	if err != nil {
		return nil, err
	}
	for _, r := range bad {
		if err := q.Put([]byte(r.Table+"/"+r.Key), b.Get([]byte(r.Key))); err != nil {
			return nil, err
		}
		if err := b.Delete([]byte(r.Key)); err != nil {
			return nil, err
		}
	}
	return bad, nil
}

// Get returns a copy of the record with this exact key.
func (t *Table[T]) Get(key string) (*T, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	item, ok := t.items[key]
	if !ok {
		return nil, fmt.Errorf("%s %q: %w", t.what, key, ErrNotFound)
	}
	return t.clone(item), nil
}

// Has reports whether a record with this exact key exists, without copying it.
func (t *Table[T]) Has(key string) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	_, ok := t.items[key]
	return ok
}

// Resolve maps an exact key or a unique key prefix to the full key, the way container runtimes
// accept truncated IDs.
func (t *Table[T]) Resolve(keyOrPrefix string) (string, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if _, ok := t.items[keyOrPrefix]; ok {
		return keyOrPrefix, nil
	}
	if keyOrPrefix == "" {
		return "", fmt.Errorf("empty %s ID: %w", t.what, ErrNotFound)
	}
	match := ""
	for k := range t.items {
		if strings.HasPrefix(k, keyOrPrefix) {
			if match != "" {
				return "", fmt.Errorf("%s ID prefix %q: %w", t.what, keyOrPrefix, ErrAmbiguous)
			}
			match = k
		}
	}
	if match == "" {
		return "", fmt.Errorf("%s %q: %w", t.what, keyOrPrefix, ErrNotFound)
	}
	return match, nil
}

// Lookup returns a copy of the record holding a unique key (a name, an image reference).
func (t *Table[T]) Lookup(uniqueKey string) (*T, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	k, ok := t.index[uniqueKey]
	if !ok {
		return nil, false
	}
	return t.clone(t.items[k]), true
}

// List returns copies of every record that matches keep (all when keep is nil), sorted by key.
func (t *Table[T]) List(keep func(*T) bool) []*T {
	t.mu.RLock()
	out := make([]*T, 0, len(t.items))
	for _, item := range t.items {
		if keep == nil || keep(item) {
			out = append(out, t.clone(item))
		}
	}
	t.mu.RUnlock()
	slices.SortFunc(out, func(a, b *T) int { return strings.Compare(t.key(a), t.key(b)) })
	return out
}

// Create stores a new record; its key and unique keys must be free.
func (t *Table[T]) Create(item *T) error {
	return t.Update(func(tx *Tx[T]) error {
		if _, ok := tx.Get(t.key(item)); ok {
			return fmt.Errorf("%s %q: %w", t.what, t.key(item), ErrExists)
		}
		return tx.Put(item)
	})
}

// Modify applies fn to the record with this key and stores the result in one transaction. It
// returns the stored copy. An error from fn aborts the change.
func (t *Table[T]) Modify(key string, fn func(*T) error) (*T, error) {
	var out *T
	err := t.Update(func(tx *Tx[T]) error {
		item, ok := tx.Get(key)
		if !ok {
			return fmt.Errorf("%s %q: %w", t.what, key, ErrNotFound)
		}
		if err := fn(item); err != nil {
			return err
		}
		out = t.clone(item)
		return tx.Put(item)
	})
	return out, err
}

// Delete removes the record with this key. A missing record is ErrNotFound.
func (t *Table[T]) Delete(key string) error {
	return t.Update(func(tx *Tx[T]) error {
		if _, ok := tx.Get(key); !ok {
			return fmt.Errorf("%s %q: %w", t.what, key, ErrNotFound)
		}
		tx.Delete(key)
		return nil
	})
}

// Update runs fn as one transaction over this table: everything fn puts and deletes is written
// and synced together, or nothing is when fn (or the disk) fails.
func (t *Table[T]) Update(fn func(tx *Tx[T]) error) error {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	tx := &Tx[T]{t: t, staged: map[string]*T{}}
	if err := fn(tx); err != nil {
		return err
	}
	if len(tx.staged) == 0 {
		return nil
	}
	faultpoint.Hit("store " + t.what + "/before")
	err := t.db.Update(func(btx *bolt.Tx) error {
		b := btx.Bucket(t.bucket)
		for k, item := range tx.staged {
			if item == nil {
				if err := b.Delete([]byte(k)); err != nil {
					return err
				}
				continue
			}
			data, err := encode(item)
			if err != nil {
				return fmt.Errorf("encode %s/%s: %w", t.bucket, k, err)
			}
			if err := b.Put([]byte(k), data); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("write %s: %w", t.bucket, err)
	}
	faultpoint.Hit("store " + t.what + "/after")
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, item := range tx.staged {
		if old, ok := t.items[k]; ok {
			for _, u := range t.unique(old) {
				if t.index[u] == k {
					delete(t.index, u)
				}
			}
		}
		if item == nil {
			delete(t.items, k)
			continue
		}
		t.items[k] = item
		for _, u := range t.unique(item) {
			t.index[u] = k
		}
	}
	return nil
}

// Tx is a transaction over one table. It reads the committed records plus its own changes.
type Tx[T any] struct {
	t      *Table[T]
	staged map[string]*T // nil value: deleted
}

// Get returns a copy of the record as this transaction sees it.
func (tx *Tx[T]) Get(key string) (*T, bool) {
	if item, ok := tx.staged[key]; ok {
		if item == nil {
			return nil, false
		}
		return tx.t.clone(item), true
	}
	tx.t.mu.RLock()
	defer tx.t.mu.RUnlock()
	item, ok := tx.t.items[key]
	if !ok {
		return nil, false
	}
	return tx.t.clone(item), true
}

// Holder returns the key of the record holding a unique key, as this transaction sees it.
func (tx *Tx[T]) Holder(uniqueKey string) (string, bool) {
	for k, item := range tx.staged {
		if item != nil && slices.Contains(tx.t.unique(item), uniqueKey) {
			return k, true
		}
	}
	tx.t.mu.RLock()
	defer tx.t.mu.RUnlock()
	k, ok := tx.t.index[uniqueKey]
	if !ok {
		return "", false
	}
	if _, changed := tx.staged[k]; changed {
		// Changed in this transaction and no longer holding it (checked above).
		return "", false
	}
	return k, true
}

// Put stages a record. A unique key held by another record is ErrExists.
func (tx *Tx[T]) Put(item *T) error {
	k := tx.t.key(item)
	for _, u := range tx.t.unique(item) {
		if holder, ok := tx.Holder(u); ok && holder != k {
			return fmt.Errorf("%q is held by %s %s: %w", u, tx.t.what, holder, ErrExists)
		}
	}
	tx.staged[k] = tx.t.clone(item)
	return nil
}

// Delete stages the removal of a record.
func (tx *Tx[T]) Delete(key string) {
	tx.staged[key] = nil
}

// List returns the records as this transaction sees them.
func (tx *Tx[T]) List() []*T {
	seen := map[string]bool{}
	var out []*T
	for k, item := range tx.staged {
		seen[k] = true
		if item != nil {
			out = append(out, tx.t.clone(item))
		}
	}
	tx.t.mu.RLock()
	for k, item := range tx.t.items {
		if !seen[k] {
			out = append(out, tx.t.clone(item))
		}
	}
	tx.t.mu.RUnlock()
	slices.SortFunc(out, func(a, b *T) int { return strings.Compare(tx.t.key(a), tx.t.key(b)) })
	return out
}
