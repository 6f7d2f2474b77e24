// Package storetest gives other packages' tests a throwaway store.
package storetest

import (
	"path/filepath"
	"testing"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// Open opens a fresh store in a temporary directory, closed when the test ends.
func Open(t testing.TB) *store.Store {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}
