package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	containerdtest "github.com/cocoonstack/cocoon-cri/test/containerd"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cocoonstack/cocoon-cri/tapmanager"
	"github.com/cocoonstack/cocoon-cri/test/registry"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// The link between the host and the first node's namespace: kubectl on the host reaches the API
// server at that node's address, as a user's kubectl reaches a node, and the host reaches the
// cluster's registry through it. One cluster runs at a time.
const (
	clusterHostIP   = "10.89.255.1"
	clusterNodeIP   = "10.89.255.2"
	clusterLinkBits = 30
	clusterHostLink = "ccri-cluster"
	// clusterDir, in the first node's directory, holds the control plane's files.
	clusterDir      = "cluster"
	ClusterNodeLink = "eth0"
	apiServerPort   = "6443"
	// clusterServiceRange is where Services get their cluster IPs; kube-proxy on every node
	// forwards them to their pods.
	clusterServiceRange = "10.96.0.0/24"
	// clusterPodRange holds every node's pod subnet (10.88.<node index>.0/24).
	clusterPodRange = "10.88.0.0/16"
	// ClusterDNSIP is the kube-dns Service's cluster IP, the pods' resolver.
	ClusterDNSIP = "10.96.0.10"
	// cocoonNodeLabel is what deploy/runtimeclass.yaml schedules cocoon pods onto.
	cocoonNodeLabel = "cocoonstack.io/runtime=cocoon-cri"
)

// The "physical" network joining the nodes: a bridge in a namespace of its own, with an address
// of its own on which the cluster's registry listens, and each node's eth1 on it. Pods reach pods
// of other nodes by pod IP through routes to each node's pod subnet: no overlay.
const (
	fabricRange = "10.89.0.0/24"
	fabricIP    = "10.89.0.1"
	// ClusterRegistry is the registry's address on the fabric, reached over plain HTTP.
	ClusterRegistry = fabricIP + ":5000"
	fabricBits      = 24
	fabricBridge    = "fabric0"
	FabricNodeLink  = "eth1"
	// MaxClusterNodes is what hack/cluster.sh up --nodes takes.
	MaxClusterNodes = 3
)

// clusterNode is one node of a cluster: a cocoon-cri (started) with containerd beside it, in its
// own network namespace, and the kubelet registered for it.
type clusterNode struct {
	n          *Node
	containerd *containerdtest.Daemon
	name       string
	// index is the node's place in the cluster: 0 holds the control plane.
	index int
	// cgroupRoot is where its kubelet makes pod cgroups (CgroupParent).
	cgroupRoot string
	kubelet    *Kubelet
}

// NodeName is the kubelet's name of the node at index: the first is the one-node cluster's.
func NodeName(index int) string {
	if index == 0 {
		return KubeletNodeName
	}
	return fmt.Sprintf("%s-%d", KubeletNodeName, index+1)
}

// PodNetwork is the pod subnet of the node at index and its gateway, on the node's bridge.
func PodNetwork(index int) (subnet, gateway string) {
	return fmt.Sprintf("10.88.%d.0/24", index), fmt.Sprintf("10.88.%d.1", index)
}

// fabricAddress is the node at index's address on the fabric.
func fabricAddress(index int) string { return fmt.Sprintf("10.89.0.%d", 11+index) }

// ip is the address the node registers with (its InternalIP): the API server and the other nodes
// reach its kubelet there.
func (cn *clusterNode) ip() string {
	if cn.index == 0 {
		return clusterNodeIP
	}
	return fabricAddress(cn.index)
}

// Cluster is a Kubernetes of one to three nodes: etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler in the first node's namespace, and on every node a kubelet and kube-proxy. A
// registry on the fabric serves every node. Every process is stopped by PID when the test ends, in
// the reverse order of its start.
type Cluster struct {
	n   *Node // the first node's
	dir string
	// kubeconfig is the administrator's, for kubectl on the host.
	kubeconfig string
	kubelet    *Kubelet // the first node's
	nodes      []*clusterNode
	fabric     string // the fabric's namespace
	registry   *registry.Server
}

// startCluster brings the control plane up beside the nodes' cocoon-cri (already started), then a
// kubelet and kube-proxy on each, and waits until every node is Ready, the cocoon RuntimeClass
// exists and the default namespace has its service account.
func startCluster(nodes []*clusterNode) *Cluster {
	n := nodes[0].n
	n.T.Helper()
	c := &Cluster{n: n, dir: filepath.Join(n.Dir, clusterDir), nodes: nodes}
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		n.T.Fatal(err)
	}
	c.linkHost()
	c.joinFabric()
	c.registry = registry.Start(n.T, registry.Options{NetNS: c.fabric, Addr: ClusterRegistry})
	names := make([]string, len(nodes))
	for i, cn := range nodes {
		names[i] = cn.name
	}
	pki := c.writePKI(names)
	c.kubeconfig = c.writeKubeconfig("admin", "https://"+net.JoinHostPort(clusterNodeIP, apiServerPort), pki.ca, pki.tokens["admin"])
	inNode := "https://" + net.JoinHostPort("127.0.0.1", apiServerPort)
	onFabric := "https://" + net.JoinHostPort(fabricAddress(0), apiServerPort)

	c.run(n, "etcd", Bins.Etcd, "--name", "node", "--data-dir", filepath.Join(c.dir, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "node=http://127.0.0.1:2380", "--listen-metrics-urls", "http://127.0.0.1:2381")
	c.waitFor("etcd's health", func() error { return httpOK(n, "http://127.0.0.1:2381/health") })

	c.run(n, "kube-apiserver", Bins.KubeAPIServer, "--etcd-servers", "http://127.0.0.1:2379",
		"--bind-address", "0.0.0.0", "--secure-port", apiServerPort, "--advertise-address", clusterNodeIP,
		"--tls-cert-file", pki.serverCert, "--tls-private-key-file", pki.serverKey, "--client-ca-file", pki.caFile,
		"--token-auth-file", pki.tokenFile, "--authorization-mode", "Node,RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", pki.saKey, "--service-account-signing-key-file", pki.saKey,
		"--service-cluster-ip-range", clusterServiceRange, "--kubelet-preferred-address-types", "InternalIP",
		"--profiling=false")
	c.waitFor("the API server's readiness", func() error { return httpOK(n, inNode+"/readyz") })

	controllers := c.writeKubeconfig("controller-manager", inNode, pki.ca, pki.tokens["controller-manager"])
	c.run(n, "kube-controller-manager", Bins.KubeControllerManager, "--kubeconfig", controllers,
		"--service-account-private-key-file", pki.saKey, "--root-ca-file", pki.caFile,
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--profiling=false")
	scheduler := c.writeKubeconfig("scheduler", inNode, pki.ca, pki.tokens["scheduler"])
	c.run(n, "kube-scheduler", Bins.KubeScheduler, "--kubeconfig", scheduler,
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--profiling=false")

	c.startDNS(c.writeKubeconfig("coredns", inNode, pki.ca, pki.tokens["coredns"]))

	for _, cn := range nodes {
		server := onFabric
		if cn.index == 0 {
			server = inNode
		}
		cn.kubelet = cn.n.StartKubeletWith(KubeletOptions{
			Name:       cn.name,
			Kubeconfig: c.writeKubeconfig("kubelet-"+cn.name, server, pki.ca, pki.tokens["kubelet-"+cn.name]),
			NodeIP:     cn.ip(), Labels: cocoonNodeLabel, CgroupRoot: cn.cgroupRoot, ClusterDNS: ClusterDNSIP,
		})
		c.startKubeProxy(cn, c.writeKubeconfig("kube-proxy-"+cn.name, server, pki.ca, pki.tokens["kube-proxy"]))
	}
	c.kubelet = nodes[0].kubelet
	root, err := RepoRoot()
	if err != nil {
		n.T.Fatal(err)
	}
	c.waitFor("the cocoon RuntimeClass", func() error {
		_, err := c.kubectl("apply", "-f", filepath.Join(root, "deploy", "runtimeclass.yaml"))
		return err
	})
	for _, cn := range nodes {
		c.waitFor(cn.name+" Ready", func() error {
			out, err := c.kubectl("get", "node", cn.name, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
			if err == nil && out != "True" {
				err = fmt.Errorf("Ready is %q", out)
			}
			return err
		})
	}
	c.waitFor("the default service account", func() error {
		_, err := c.kubectl("get", "serviceaccount", "default")
		return err
	})
	return c
}

// clusterDNSObjects give CoreDNS what it reads (the bootstrap roles have nothing for it), and
// make it the kube-dns Service: a Service without a selector, whose one endpoint is CoreDNS on the
// first node's fabric address, where every node's pods reach it through kube-proxy.
var clusterDNSObjects = `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [services, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:coredns"}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: ` + ClusterDNSIP + `
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-coredns
  namespace: kube-system
  labels: {kubernetes.io/service-name: kube-dns}
addressType: IPv4
endpoints:
- addresses: [` + fabricAddress(0) + `]
ports:
- {name: dns, port: 53, protocol: UDP}
- {name: dns-tcp, port: 53, protocol: TCP}
`

// startDNS runs CoreDNS (bin/coredns: the kubernetes plugin and little else) on the first node,
// serving cluster.local from the API server, and waits until it has read the API.
func (c *Cluster) startDNS(kubeconfig string) {
	c.n.T.Helper()
	c.waitFor("the cluster DNS objects", func() error {
		_, err := c.kubectlStdin(clusterDNSObjects, "apply", "-f", "-")
		return err
	})
	corefile := filepath.Join(c.dir, "Corefile")
	data := fmt.Sprintf(`. {
    errors
    health 127.0.0.1:8080
    ready 127.0.0.1:8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig %s
        pods insecure
    }
    cache 30
    loadbalance
}
`, kubeconfig)
	if err := os.WriteFile(corefile, []byte(data), 0o600); err != nil {
		c.n.T.Fatal(err)
	}
	c.run(c.n, "coredns", Bins.CoreDNS, "-conf", corefile, "-dns.port", "53")
	c.waitFor("CoreDNS's readiness", func() error { return httpOK(c.n, "http://127.0.0.1:8181/ready") })
}

// startKubeProxy runs kube-proxy in iptables mode in the node's namespace. Its conntrack settings
// are left alone: they are the host's, not the namespace's.
func (c *Cluster) startKubeProxy(cn *clusterNode, kubeconfig string) {
	cn.n.T.Helper()
	config := filepath.Join(c.dir, "kube-proxy-"+cn.name+".yaml")
	data := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %q}
hostnameOverride: %q
mode: iptables
clusterCIDR: %q
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
`, kubeconfig, cn.name, clusterPodRange)
	if err := os.WriteFile(config, []byte(data), 0o600); err != nil {
		cn.n.T.Fatal(err)
	}
	c.run(cn.n, "kube-proxy-"+cn.name, Bins.KubeProxy, "--config", config)
	c.waitFor("kube-proxy's health on "+cn.name, func() error { return httpOK(cn.n, "http://127.0.0.1:10256/livez") })
}

// linkHost connects the first node's namespace to the host with a veth pair of its own
// addresses, and routes the fabric through it.
func (c *Cluster) linkHost() {
	t := c.n.T
	t.Helper()
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	_, fabric, _ := net.ParseCIDR(fabricRange)
	for _, r := range routes {
		if ones, _ := r.Dst.Mask.Size(); r.Dst != nil && ones > 0 && (r.Dst.Contains(net.ParseIP(clusterNodeIP)) || r.Dst.Contains(fabric.IP) || fabric.Contains(r.Dst.IP)) {
			t.Fatalf("the host already routes %s (%s): the cluster's link would shadow it", r.Dst, r)
		}
	}
	nodeNS, err := os.Open(c.n.NodeNS)
	if err != nil {
		t.Fatal(err)
	}
	defer nodeNS.Close()
	// The node's end is made in its namespace: the host has an eth0 of its own.
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: clusterHostLink}, PeerName: ClusterNodeLink,
		PeerNamespace: netlink.NsFd(int(nodeNS.Fd()))}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("the cluster's host link %s: %v (is a cluster up already? hack/cluster.sh down)", clusterHostLink, err)
	}
	// The host's route to the fabric goes with the link.
	t.Cleanup(func() {
		if link, err := netlink.LinkByName(clusterHostLink); err == nil {
			_ = netlink.LinkDel(link)
		}
	})
	if err := addressUp(clusterHostLink, clusterHostIP, clusterLinkBits); err != nil {
		t.Fatal(err)
	}
	c.n.InNode(func() error { return addressUp(ClusterNodeLink, clusterNodeIP, clusterLinkBits) })
	if err := addRoute(fabricRange, clusterNodeIP); err != nil {
		t.Fatalf("the host's route to the fabric: %v", err)
	}
}

// joinFabric makes the fabric's namespace and bridge, puts every node on it, and routes each
// node's pod subnet to it from the others.
func (c *Cluster) joinFabric() {
	t := c.n.T
	t.Helper()
	c.fabric = filepath.Join(c.dir, "fabric.netns")
	if err := (&tapmanager.NetNS{}).CreateNetNS(c.fabric); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := (&tapmanager.NetNS{}).RemoveNetNS(c.fabric); err != nil {
			t.Errorf("remove the fabric's namespace: %v", err)
		}
	})
	inFabric := func(fn func() error) {
		t.Helper()
		if err := ns.WithNetNSPath(c.fabric, func(ns.NetNS) error { return fn() }); err != nil {
			t.Fatal(err)
		}
	}
	inFabric(func() error {
		if err := setLinkUp("lo"); err != nil {
			return err
		}
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: fabricBridge}}); err != nil {
			return fmt.Errorf("the fabric's bridge: %w", err)
		}
		// The host's traffic to the registry comes through the first node.
		if err := addressUp(fabricBridge, fabricIP, fabricBits); err != nil {
			return err
		}
		return addRoute(fmt.Sprintf("%s/%d", clusterHostIP, clusterLinkBits), fabricAddress(0))
	})
	fabricNS, err := os.Open(c.fabric)
	if err != nil {
		t.Fatal(err)
	}
	defer fabricNS.Close()
	for _, cn := range c.nodes {
		port := "fabric-" + strconv.Itoa(cn.index)
		cn.n.InNode(func() error {
			veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: FabricNodeLink}, PeerName: port,
				PeerNamespace: netlink.NsFd(int(fabricNS.Fd()))}
			if err := netlink.LinkAdd(veth); err != nil {
				return fmt.Errorf("%s's link to the fabric: %w", cn.name, err)
			}
			if err := addressUp(FabricNodeLink, fabricAddress(cn.index), fabricBits); err != nil {
				return err
			}
			// The node forwards: pods to other nodes' pods, the host to the fabric.
			if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
				return err
			}
			for _, other := range c.nodes {
				if other != cn {
					subnet, _ := PodNetwork(other.index)
					if err := addRoute(subnet, fabricAddress(other.index)); err != nil {
						return fmt.Errorf("%s's route to %s's pods: %w", cn.name, other.name, err)
					}
				}
			}
			return nil
		})
		inFabric(func() error {
			bridge, err := netlink.LinkByName(fabricBridge)
			if err != nil {
				return err
			}
			link, err := netlink.LinkByName(port)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetMaster(link, bridge); err != nil {
				return err
			}
			return netlink.LinkSetUp(link)
		})
	}
}

// addressUp gives the link name ip/bits and sets it up.
func addressUp(name, ip string, bits int) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	addr, err := netlink.ParseAddr(fmt.Sprintf("%s/%d", ip, bits))
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(link, addr); err != nil {
		return fmt.Errorf("address %s on %s: %w", addr, name, err)
	}
	return netlink.LinkSetUp(link)
}

func setLinkUp(name string) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(link)
}

// addRoute routes dst (a CIDR) via gateway.
func addRoute(dst, gateway string) error {
	_, cidr, err := net.ParseCIDR(dst)
	if err != nil {
		return err
	}
	return netlink.RouteAdd(&netlink.Route{Dst: cidr, Gw: net.ParseIP(gateway)})
}

// clusterPKI are the files the control plane authenticates with: a CA and the API server's
// certificate from it, the service-account signing key, and a bearer token per identity.
type clusterPKI struct {
	ca                    []byte // PEM
	caFile                string
	serverCert, serverKey string
	saKey                 string
	tokenFile             string
	tokens                map[string]string // by identity: admin, controller-manager, scheduler, kube-proxy, kubelet-<node>
}

// writePKI writes the cluster's credentials; nodes are the kubelets' node names.
func (c *Cluster) writePKI(nodes []string) clusterPKI {
	t := c.n.T
	t.Helper()
	newKey := func() *ecdsa.PrivateKey {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return key
	}
	writePEM := func(name, kind string, der []byte) string {
		path := filepath.Join(c.dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	writeKey := func(name string, key *ecdsa.PrivateKey) string {
		der, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return writePEM(name, "EC PRIVATE KEY", der)
	}
	now := time.Now()
	caKey := newKey()
	caTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cocoon-cri test cluster CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, caKey.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	serverKey := newKey()
	serverDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(clusterNodeIP), net.ParseIP(fabricAddress(0)), net.ParseIP("10.96.0.1")},
	}, ca, serverKey.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	p := clusterPKI{
		ca:         pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		caFile:     writePEM("ca.crt", "CERTIFICATE", caDER),
		serverCert: writePEM("apiserver.crt", "CERTIFICATE", serverDER),
		serverKey:  writeKey("apiserver.key", serverKey),
		saKey:      writeKey("service-accounts.key", newKey()),
		tokens:     map[string]string{},
	}
	// The control plane's own components act as administrators; a kubelet is a node, which the
	// Node authorizer confines to its own pods; kube-proxy gets the bootstrap role bound to its
	// user, system:node-proxier.
	identities := []struct{ name, user, groups string }{
		{"admin", "admin", "system:masters"},
		{"controller-manager", "system:kube-controller-manager", "system:masters"},
		{"scheduler", "system:kube-scheduler", "system:masters"},
		{"kube-proxy", "system:kube-proxy", ""},
		{"coredns", "system:coredns", ""},
	}
	for _, name := range nodes {
		identities = append(identities, struct{ name, user, groups string }{"kubelet-" + name, "system:node:" + name, "system:nodes"})
	}
	var csv strings.Builder
	for _, id := range identities {
		token := make([]byte, 16)
		if _, err := rand.Read(token); err != nil {
			t.Fatal(err)
		}
		p.tokens[id.name] = fmt.Sprintf("%x", token)
		fmt.Fprintf(&csv, "%s,%s,%s,%q\n", p.tokens[id.name], id.user, id.user, id.groups)
	}
	p.tokenFile = filepath.Join(c.dir, "tokens.csv")
	if err := os.WriteFile(p.tokenFile, []byte(csv.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// writeKubeconfig writes a kubeconfig for one identity and returns its path.
func (c *Cluster) writeKubeconfig(name, server string, ca []byte, token string) string {
	c.n.T.Helper()
	path := filepath.Join(c.dir, name+".kubeconfig")
	config := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: cocoon
  cluster: {server: %q, certificate-authority-data: %q}
users:
- name: %[3]s
  user: {token: %[4]q}
contexts:
- name: cocoon
  context: {cluster: cocoon, user: %[3]s, namespace: default}
current-context: cocoon
`, server, base64.StdEncoding.EncodeToString(ca), name, token)
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		c.n.T.Fatal(err)
	}
	return path
}

// run starts a cluster process in node's namespace, logging to <name>.log; it is stopped when the
// test ends, and its log's tail shown if the test failed.
func (c *Cluster) run(node *Node, name, binary string, args ...string) *testproc.Process {
	t := c.n.T
	t.Helper()
	logPath := filepath.Join(c.dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command("nsenter", append([]string{"--net=" + node.NodeNS, "--", binary}, args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	proc, err := testproc.Start(cmd)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() {
		_, _ = proc.Stop(30 * time.Second)
		if t.Failed() {
			data, _ := os.ReadFile(logPath)
			t.Logf("%s log (last 60 lines):\n%s", name, LastLines(string(data), 60))
		}
	})
	return proc
}

// waitFor polls ready for up to three minutes (the API server's first start migrates etcd and
// installs every bootstrap object; slow on two busy cores).
func (c *Cluster) waitFor(what string, ready func() error) {
	c.n.T.Helper()
	var last error
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if last = ready(); last == nil {
			return
		}
	}
	c.n.T.Fatalf("%s: not within 3 minutes: %v", what, last)
}

// kubectl runs bin/kubectl on the host with the administrator's kubeconfig.
func (c *Cluster) kubectl(args ...string) (string, error) {
	return c.kubectlStdin("", args...)
}

// kubectlStdin is kubectl with stdin.
func (c *Cluster) kubectlStdin(stdin string, args ...string) (string, error) {
	cmd := exec.Command(Bins.Kubectl, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.kubeconfig)
	cmd.Stdin = strings.NewReader(stdin)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// httpOK GETs url in the node's namespace and wants 200.
func httpOK(n *Node, url string) error {
	status, body, err := n.HTTPGetInNode(url)
	if err == nil && status != 200 {
		err = fmt.Errorf("%s: %d %s", url, status, body)
	}
	return err
}
