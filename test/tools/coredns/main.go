// Command coredns is the cluster DNS of hack/cluster.sh: CoreDNS from its own module, linked with
// only the plugins the cluster's Corefile uses, so a cold build stays small. The stock binary
// (github.com/coredns/coredns, package main) links every plugin CoreDNS ships, with the cloud SDKs
// of route53, azure and clouddns; this one serves cluster.local from the API server and nothing
// else. There is no forward plugin: the test cluster has no upstream resolver to forward to.
//
// A module of its own, like test/tools/etcd: CoreDNS's client-go must not move the kubelet's.
// hack/build-tools.sh builds it as bin/coredns; `bin/coredns -plugins` lists what is linked.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// Each plugin registers itself with the server when imported.
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/ready"
)

// directives is the order a query passes the plugins in, whatever the order of the Corefile: the
// relative order of CoreDNS's plugin.cfg, cut down to the plugins imported above. A plugin sees
// the answers of those after it, so cache stores what kubernetes answers and loadbalance shuffles
// what cache returns.
var directives = []string{
	"ready",
	"health",
	"errors",
	"loadbalance",
	"cache",
	"kubernetes",
}

func main() {
	dnsserver.Directives = directives
	coremain.Run()
}
