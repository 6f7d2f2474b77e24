// Package store keeps cocoon-cri's records (sandboxes, containers, images) in a bbolt file under the
// state dir. Every change is one read-modify-write transaction, synced to disk before it returns,
// so an RPC that reports success has its record on disk; changes that reach the disk at the same
// time share one bbolt transaction and one sync. Reads are served from an
// in-memory mirror, so the kubelet's relist every second never waits on the disk.
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containerd/errdefs"

	bolt "go.etcd.io/bbolt"
)

// SchemaVersion is the layout of the records written by this build. Open refuses a file written by
// a newer schema and upgrades older ones.
const SchemaVersion = 1

var (
	// ErrNotFound: no record with that ID (or key).
	ErrNotFound = fmt.Errorf("%w", errdefs.ErrNotFound)
	// ErrAmbiguous: an ID prefix matches more than one record.
	ErrAmbiguous = errdefs.ErrInvalidArgument.WithMessage("ambiguous ID prefix")
	// ErrExists: the ID or a unique key (a name, an image reference) is held by another record.
	ErrExists = fmt.Errorf("%w", errdefs.ErrAlreadyExists)
)

var (
	metaBucket = []byte("meta")
	schemaKey  = []byte("schema")
	// quarantineBucket keeps the records that could not be decoded, as they were, under
	// "<table>/<key>", for an operator to look at.
	quarantineBucket = []byte("quarantine")
)

// Quarantined is a record that could not be decoded at Open and was moved aside.
type Quarantined struct {
	Table string `json:"table"`
	Key   string `json:"key"`
	Err   string `json:"error"`
}

// Store is the open state database.
type Store struct {
	db         *bolt.DB
	Sandboxes  *Table[Sandbox]
	Containers *Table[Container]
	Images     *Table[Image]
	PoolVMs    *Table[PoolVM]
	// Quarantined lists the records this Open moved to the quarantine bucket.
	Quarantined []Quarantined
}

// Open opens or creates the database at path. It fails fast when another process holds it.
func Open(path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("open %s: held by another process (is another cocoon-cri running on this state dir?)", path)
		}
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	commits := &committer{db: db}
	s := &Store{
		db:         db,
		Sandboxes:  newTable(commits, "sandboxes", "sandbox", (*Sandbox).key, (*Sandbox).uniqueKeys, (*Sandbox).clone),
		Containers: newTable(commits, "containers", "container", (*Container).key, (*Container).uniqueKeys, (*Container).clone),
		Images:     newTable(commits, "images", "image", (*Image).key, (*Image).uniqueKeys, (*Image).clone),
		PoolVMs:    newTable(commits, "pool_vms", "pool VM", (*PoolVM).key, (*PoolVM).uniqueKeys, (*PoolVM).clone),
	}
	if err := s.init(); err != nil {
		db.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return s, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

func (s *Store) init() error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(metaBucket)
		if err != nil {
			return err
		}
		version := 0
		if raw := meta.Get(schemaKey); raw != nil {
			if version, err = strconv.Atoi(string(raw)); err != nil {
				return fmt.Errorf("bad schema version %q", raw)
			}
		}
		if version > SchemaVersion {
			return fmt.Errorf("written by a newer cocoon-cri (schema %d, this build reads up to %d)", version, SchemaVersion)
		}
		// Migrations from older schemas go here, in order, inside this transaction.
		for _, t := range []interface{ createBucket(*bolt.Tx) error }{s.Sandboxes, s.Containers, s.Images, s.PoolVMs} {
			if err := t.createBucket(tx); err != nil {
				return err
			}
		}
		return meta.Put(schemaKey, []byte(strconv.Itoa(SchemaVersion)))
	})
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		for _, t := range []interface {
			load(*bolt.Tx) ([]Quarantined, error)
		}{s.Sandboxes, s.Containers, s.Images, s.PoolVMs} {
			bad, err := t.load(tx)
			if err != nil {
				return err
			}
			s.Quarantined = append(s.Quarantined, bad...)
		}
		return nil
	})
}

func encode(v any) ([]byte, error) { return json.Marshal(v) }

func decode(data []byte, v any) error { return json.Unmarshal(data, v) }
