package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/registry"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// registry runs a registry server on the loopback of the node's network namespace, where the
// daemon pulls from; its Target pushes there from the test.
func (n *node) registry(opts registry.Options) *registry.Server {
	n.t.Helper()
	opts.NetNS = n.NodeNS
	return registry.Start(n.t, opts)
}

// pushSnapshot pushes a snapshot archive named name (its base files installed on the node, as on
// a node that has the snapshot's base image) under repoTag, as epoch push does.
func (n *node) pushSnapshot(target registry.Target, repoTag, name string, snap testimage.SnapshotOptions, push registry.SnapshotPush) registry.Pushed {
	n.t.Helper()
	f, err := os.Open(n.SnapshotImage(name, snap))
	if err != nil {
		n.t.Fatal(err)
	}
	defer f.Close()
	pushed, err := target.PushSnapshot(context.Background(), repoTag, f, push)
	if err != nil {
		n.t.Fatal(err)
	}
	return pushed
}

// pushCloudImage pushes a qcow2 cloud image split in parts, and installs the firmware cocoon boots
// it with.
func (n *node) pushCloudImage(target registry.Target, repoTag string, parts int) registry.Pushed {
	n.t.Helper()
	disk, err := os.ReadFile(n.cloudImage(strings.NewReplacer("/", "_", ":", "_").Replace(repoTag)))
	if err != nil {
		n.t.Fatal(err)
	}
	pushed, err := target.PushCloudImage(context.Background(), repoTag, disk, parts)
	if err != nil {
		n.t.Fatal(err)
	}
	return pushed
}

// pushOCIImage pushes an OCI VM image: one layer with a kernel and an initrd.
func (n *node) pushOCIImage(target registry.Target, repoTag string) registry.Pushed {
	n.t.Helper()
	var layer bytes.Buffer
	if err := testimage.WriteOCILayer(&layer, testimage.LayerOptions{}); err != nil {
		n.t.Fatal(err)
	}
	pushed, err := target.PushOCIImage(context.Background(), repoTag, layer.Bytes())
	if err != nil {
		n.t.Fatal(err)
	}
	return pushed
}

// pull runs crictl pull and returns the image ID it reports ("Image is up to date for <ID>").
func (n *node) pull(args ...string) string {
	n.t.Helper()
	out := n.mustCrictl(append([]string{"pull"}, args...)...)
	fields := strings.Fields(out)
	if len(fields) == 0 {
		n.t.Fatalf("crictl pull printed nothing")
	}
	return fields[len(fields)-1]
}

// cocoonImages lists the simulator's cloud and OCI images.
func (n *node) cocoonImages() []cocoon.Image { return cocoonList[cocoon.Image](n, "image") }

// assertNothingPulled checks that no image is recorded and cocoon holds no artifact of any kind.
func (n *node) assertNothingPulled() {
	n.t.Helper()
	n.assertNoImages()
	if imgs := n.cocoonImages(); len(imgs) != 0 {
		n.t.Fatalf("cocoon images left: %+v", imgs)
	}
}

// eventuallyNothingPulled waits for a pull the client gave up on to be cleaned up by the daemon.
func (n *node) eventuallyNothingPulled() {
	n.t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if len(n.images().Images) == 0 && len(n.snapshots()) == 0 && len(n.cocoonImages()) == 0 {
			return
		}
	}
	n.assertNothingPulled()
}

// erofsHasTar reports whether the node's mkfs.erofs converts tar streams, which cocoon needs to
// pull an OCI VM image (Debian 12's erofs-utils 1.5 cannot).
func erofsHasTar() bool {
	out, _ := exec.Command("mkfs.erofs", "--help").CombinedOutput()
	return strings.Contains(string(out), "--tar")
}
