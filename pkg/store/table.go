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
	commits *committer
	bucket  []byte
	what    string // a record's name in errors: "sandbox"
	key     func(*T) string
	unique  func(*T) []string
	clone   func(*T) *T

	// writeMu serialises the transactions' reads and changes (not their writes to disk): a
	// transaction reads a state nobody else changes until its own changes are pending.
	writeMu sync.Mutex
	// mu guards the mirror and pending; it is held only to copy in or out, never across a disk
	// sync.
	mu    sync.RWMutex
	items map[string]*T
	index map[string]string // unique key -> record key
	// pending holds, by record key, the transactions handed to the committer and not yet settled.
	// A transaction that reads or changes one of their records waits for them: nothing is built on
	// a change that may still fail.
	pending map[string]*pendingTx[T]
}

// pendingTx is a transaction on its way to disk: its changes, and done, closed once it is settled.
type pendingTx[T any] struct {
	staged map[string]*T
	done   chan struct{}
}

func newTable[T any](commits *committer, bucket, what string, key func(*T) string, unique func(*T) []string, clone func(*T) *T) *Table[T] {
	return &Table[T]{
		commits: commits, bucket: []byte(bucket), what: what, key: key, unique: unique, clone: clone,
		items: map[string]*T{}, index: map[string]string{}, pending: map[string]*pendingTx[T]{},
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
// and synced together, or nothing is when fn (or the disk) fails. Transactions of every table that
// reach the disk at the same time share one write and one sync (committer).
func (t *Table[T]) Update(fn func(tx *Tx[T]) error) error {
	t.writeMu.Lock()
	tx := &Tx[T]{t: t, staged: map[string]*T{}}
	if err := fn(tx); err != nil {
		t.writeMu.Unlock()
		return err
	}
	if len(tx.staged) == 0 {
		t.writeMu.Unlock()
		return nil
	}
	encoded := make(map[string][]byte, len(tx.staged))
	for k, item := range tx.staged {
		if item == nil {
			encoded[k] = nil
			continue
		}
		data, err := encode(item)
		if err != nil {
			t.writeMu.Unlock()
			return fmt.Errorf("encode %s/%s: %w", t.bucket, k, err)
		}
		encoded[k] = data
	}
	p := &pendingTx[T]{staged: tx.staged, done: make(chan struct{})}
	t.mu.Lock()
	for k := range tx.staged {
		t.pending[k] = p
	}
	t.mu.Unlock()
	t.writeMu.Unlock()

	faultpoint.Hit("store " + t.what + "/before")
	err := t.commits.commit(func(btx *bolt.Tx) error {
		b := btx.Bucket(t.bucket)
		for k, data := range encoded {
			if data == nil {
				if err := b.Delete([]byte(k)); err != nil {
					return err
				}
				continue
			}
			if err := b.Put([]byte(k), data); err != nil {
				return err
			}
		}
		return nil
	}, func(err error) { t.settle(p, err) })
	if err != nil {
		return fmt.Errorf("write %s: %w", t.bucket, err)
	}
	faultpoint.Hit("store " + t.what + "/after")
	return nil
}

// settle mirrors a transaction that reached the disk, or drops one that did not, and lets those
// waiting for it go on.
func (t *Table[T]) settle(p *pendingTx[T], err error) {
	t.mu.Lock()
	defer close(p.done)
	defer t.mu.Unlock()
	for k := range p.staged {
		if t.pending[k] == p {
			delete(t.pending, k)
		}
	}
	if err != nil {
		return
	}
	for k, item := range p.staged {
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
}

// Tx is a transaction over one table. It reads the committed records plus its own changes: a
// record another transaction is writing to disk is waited for, and read once it is settled.
type Tx[T any] struct {
	t      *Table[T]
	staged map[string]*T // nil value: deleted
}

// settled runs read on the mirror under its read lock once nothing this read depends on is
// pending: read returns the pending transaction it found in its way, if any, and is run again
// after that one is settled. The caller holds writeMu, which no settling needs.
func (tx *Tx[T]) settled(read func() *pendingTx[T]) {
	for {
		tx.t.mu.RLock()
		p := read()
		tx.t.mu.RUnlock()
		if p == nil {
			return
		}
		<-p.done
	}
}

// Get returns a copy of the record as this transaction sees it.
func (tx *Tx[T]) Get(key string) (*T, bool) {
	if item, ok := tx.staged[key]; ok {
		if item == nil {
			return nil, false
		}
		return tx.t.clone(item), true
	}
	var out *T
	tx.settled(func() *pendingTx[T] {
		if p := tx.t.pending[key]; p != nil {
			return p
		}
		if item, ok := tx.t.items[key]; ok {
			out = tx.t.clone(item)
		}
		return nil
	})
	return out, out != nil
}

// Holder returns the key of the record holding a unique key, as this transaction sees it.
func (tx *Tx[T]) Holder(uniqueKey string) (string, bool) {
	for k, item := range tx.staged {
		if item != nil && slices.Contains(tx.t.unique(item), uniqueKey) {
			return k, true
		}
	}
	holder, held := "", false
	tx.settled(func() *pendingTx[T] {
		for _, p := range tx.t.pending {
			for _, item := range p.staged {
				if item != nil && slices.Contains(tx.t.unique(item), uniqueKey) {
					return p
				}
			}
		}
		k, ok := tx.t.index[uniqueKey]
		if !ok {
			return nil
		}
		if p := tx.t.pending[k]; p != nil {
			return p
		}
		if _, changed := tx.staged[k]; changed {
			// Changed in this transaction and no longer holding it (checked above).
			return nil
		}
		holder, held = k, true
		return nil
	})
	return holder, held
}

// Put stages a record. A unique key held by another record is ErrExists.
func (tx *Tx[T]) Put(item *T) error {
	k := tx.t.key(item)
	for _, u := range tx.t.unique(item) {
		if holder, ok := tx.Holder(u); ok && holder != k {
			return fmt.Errorf("%q is held by %s %s: %w", u, tx.t.what, holder, ErrExists)
		}
	}
	tx.awaitRecord(k)
	tx.staged[k] = tx.t.clone(item)
	return nil
}

// Delete stages the removal of a record.
func (tx *Tx[T]) Delete(key string) {
	tx.awaitRecord(key)
	tx.staged[key] = nil
}

// awaitRecord waits until no other transaction is writing the record: changes to one record
// reach the disk, and the mirror, in the order they were made.
func (tx *Tx[T]) awaitRecord(key string) {
	tx.settled(func() *pendingTx[T] { return tx.t.pending[key] })
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
	tx.settled(func() *pendingTx[T] {
		for _, p := range tx.t.pending {
			return p
		}
		for k, item := range tx.t.items {
			if !seen[k] {
				out = append(out, tx.t.clone(item))
			}
		}
		return nil
	})
	slices.SortFunc(out, func(a, b *T) int { return strings.Compare(tx.t.key(a), tx.t.key(b)) })
	return out
}
