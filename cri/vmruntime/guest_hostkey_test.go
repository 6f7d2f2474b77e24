package vmruntime

import (
	"crypto/ed25519"
	"crypto/rand"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// A guest's SSH host key is pinned at the first login and kept in the container's record; a
// different key later is refused, also after the record is read back from disk.
func TestChangedGuestHostKeyIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Containers.Create(&store.Container{ID: "c1", Name: "c1"}); err != nil {
		t.Fatal(err)
	}
	g := &guestExecutor{store: st}
	first, second := hostKey(t), hostKey(t)
	if err := g.trustOnFirstUse("c1")("guest:22", nil, first); err != nil {
		t.Fatalf("first login: %v", err)
	}
	if err := g.trustOnFirstUse("c1")("guest:22", nil, first); err != nil {
		t.Fatalf("the pinned key again: %v", err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err = store.Open(path); err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	g = &guestExecutor{store: st}
	err = g.trustOnFirstUse("c1")("guest:22", nil, second)
	if err == nil || !strings.Contains(err.Error(), "host key changed") {
		t.Fatalf("a different key: %v, want refused", err)
	}
	if c, _ := st.Containers.Get("c1"); c.VM.SSHHostKey != string(ssh.MarshalAuthorizedKey(first)) {
		t.Fatalf("the pinned key was replaced: %q", c.VM.SSHHostKey)
	}
}

func hostKey(t *testing.T) ssh.PublicKey {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return key
}
