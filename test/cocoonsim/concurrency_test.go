package cocoonsim_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// TestParallelClonesAllLand: ten clones at once, serialised only by the vms.json flock, all end
// up in the index with their own names; two clones racing for one name leave exactly one VM.
func TestParallelClonesAllLand(t *testing.T) {
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	const n = 10
	results := make([]result, n+2)
	var wg sync.WaitGroup
	for i := range n + 2 {
		name := fmt.Sprintf("par-%d", i)
		if i >= n {
			name = "contested"
		}
		wg.Go(func() { results[i] = s.cocoon("vm", "clone", "--name", name, "-o", "json", "base") })
	}
	wg.Wait()
	for i, r := range results[:n] {
		if r.code != 0 {
			t.Errorf("clone par-%d: exit %d, %s", i, r.code, stripANSI(r.stderr))
		}
	}
	contested := results[n:]
	if (contested[0].code == 0) == (contested[1].code == 0) {
		t.Fatalf("exactly one of two same-name clones must win: exits %d and %d", contested[0].code, contested[1].code)
	}
	for _, r := range contested {
		if r.code != 0 && !strings.Contains(r.errorLine(), `vm name "contested" already exists`) {
			t.Errorf("losing clone: %q", r.errorLine())
		}
	}

	var idx struct {
		VMs   map[string]json.RawMessage `json:"vms"`
		Names map[string]string          `json:"names"`
	}
	data, err := os.ReadFile(filepath.Join(s.root, "cloudhypervisor", "db", "vms.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		t.Fatalf("vms.json is not valid JSON: %v", err)
	}
	if len(idx.VMs) != n+1 || len(idx.Names) != n+1 {
		t.Fatalf("vms.json has %d VMs and %d names, want %d", len(idx.VMs), len(idx.Names), n+1)
	}
	for _, vm := range decode[[]cocoon.VM](t, s.ok("vm", "list", "-o", "json")) {
		if vm.State != cocoon.VMStateRunning || !testproc.Running(vm.PID) {
			t.Errorf("%s: state %s pid %d", vm.Config.Name, vm.State, vm.PID)
		}
	}
}
