package store

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// The committer against bbolt's DB.Batch, both writing one small record per transaction to a
// synced file: one writer alone (a lifecycle RPC on a quiet node), and 50 at once (a node starting
// pods). The comment on committer quotes the figures.

func benchDB(b *testing.B) *bolt.DB {
	b.Helper()
	db, err := bolt.Open(filepath.Join(b.TempDir(), "bench.db"), 0o600, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("b")); return err }); err != nil {
		b.Fatal(err)
	}
	return db
}

func put(i int) func(*bolt.Tx) error {
	return func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("b")).Put(fmt.Appendf(nil, "key-%d", i), []byte("a record of about this size"))
	}
}

func benchWriters(b *testing.B, writers int, commit func(i int) error) {
	b.Helper()
	for i := 0; b.Loop(); i++ {
		var wg sync.WaitGroup
		for w := range writers {
			wg.Go(func() {
				if err := commit(i*writers + w); err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
	}
}

func BenchmarkCommitterAlone(b *testing.B) {
	c := &committer{db: benchDB(b)}
	benchWriters(b, 1, func(i int) error { return c.commit(put(i), func(error) {}) })
}

func BenchmarkBatchAlone(b *testing.B) {
	db := benchDB(b)
	benchWriters(b, 1, func(i int) error { return db.Batch(put(i)) })
}

func BenchmarkCommitter50(b *testing.B) {
	c := &committer{db: benchDB(b)}
	benchWriters(b, 50, func(i int) error { return c.commit(put(i), func(error) {}) })
}

func BenchmarkBatch50(b *testing.B) {
	db := benchDB(b)
	benchWriters(b, 50, func(i int) error { return db.Batch(put(i)) })
}
