package e2e

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
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// The link between the host and a cluster node's namespace: kubectl on the host reaches the API
// server at the node's address, as a user's kubectl reaches a node. Nothing else is routed over
// it, and one cluster runs at a time.
const (
	clusterHostIP   = "10.89.255.1"
	clusterNodeIP   = "10.89.255.2"
	clusterLinkBits = 30
	clusterHostLink = "ccri-cluster"
	clusterNodeLink = "eth0"
	apiServerPort   = "6443"
	// clusterServiceRange holds the kubernetes Service's address; nothing routes it, no pod here
	// needs the API server.
	clusterServiceRange = "10.96.0.0/24"
	// cocoonNodeLabel is what deploy/runtimeclass.yaml schedules cocoon pods onto.
	cocoonNodeLabel = "cocoonstack.io/runtime=cocoon-cri"
)

// cluster is a one-node Kubernetes in a node's namespace: etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler, and the node's kubelet registered with them. Every
// process is stopped by PID when the test ends, in the reverse order of its start.
type cluster struct {
	n   *node
	dir string
	// kubeconfig is the administrator's, for kubectl on the host.
	kubeconfig string
	kubelet    *kubelet
}

// startCluster brings the control plane up beside the node's cocoon-cri (already started) and
// waits until the node is Ready, the cocoon RuntimeClass exists and the default namespace has its
// service account. The kubelet makes its pods' cgroups under cgroupRoot (testCgroupParent).
func (n *node) startCluster(cgroupRoot string) *cluster {
	n.t.Helper()
	c := &cluster{n: n, dir: filepath.Join(n.dir, "cluster")}
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		n.t.Fatal(err)
	}
	c.linkHost()
	pki := c.writePKI()
	c.kubeconfig = c.writeKubeconfig("admin", "https://"+net.JoinHostPort(clusterNodeIP, apiServerPort), pki.ca, pki.tokens["admin"])
	inNode := "https://" + net.JoinHostPort("127.0.0.1", apiServerPort)

	c.run("etcd", bins.etcd, "--name", "node", "--data-dir", filepath.Join(c.dir, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "node=http://127.0.0.1:2380", "--listen-metrics-urls", "http://127.0.0.1:2381")
	c.waitFor("etcd's health", func() error { return httpOK(n, "http://127.0.0.1:2381/health") })

	c.run("kube-apiserver", bins.kubeAPIServer, "--etcd-servers", "http://127.0.0.1:2379",
		"--bind-address", "0.0.0.0", "--secure-port", apiServerPort, "--advertise-address", clusterNodeIP,
		"--tls-cert-file", pki.serverCert, "--tls-private-key-file", pki.serverKey, "--client-ca-file", pki.caFile,
		"--token-auth-file", pki.tokenFile, "--authorization-mode", "Node,RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", pki.saKey, "--service-account-signing-key-file", pki.saKey,
		"--service-cluster-ip-range", clusterServiceRange, "--kubelet-preferred-address-types", "InternalIP",
		"--profiling=false")
	c.waitFor("the API server's readiness", func() error { return httpOK(n, inNode+"/readyz") })

	controllers := c.writeKubeconfig("controller-manager", inNode, pki.ca, pki.tokens["controller-manager"])
	c.run("kube-controller-manager", bins.kubeControllerManager, "--kubeconfig", controllers,
		"--service-account-private-key-file", pki.saKey, "--root-ca-file", pki.caFile,
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--profiling=false")
	scheduler := c.writeKubeconfig("scheduler", inNode, pki.ca, pki.tokens["scheduler"])
	c.run("kube-scheduler", bins.kubeScheduler, "--kubeconfig", scheduler,
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--profiling=false")

	c.kubelet = n.startKubeletWith(kubeletOptions{
		kubeconfig: c.writeKubeconfig("kubelet", inNode, pki.ca, pki.tokens["kubelet"]),
		nodeIP:     clusterNodeIP, labels: cocoonNodeLabel, cgroupRoot: cgroupRoot,
	})
	root, err := repoRoot()
	if err != nil {
		n.t.Fatal(err)
	}
	c.waitFor("the cocoon RuntimeClass", func() error {
		_, err := c.kubectl("apply", "-f", filepath.Join(root, "deploy", "runtimeclass.yaml"))
		return err
	})
	c.waitFor("the node Ready", func() error {
		out, err := c.kubectl("get", "node", kubeletNodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err == nil && out != "True" {
			err = fmt.Errorf("Ready is %q", out)
		}
		return err
	})
	c.waitFor("the default service account", func() error {
		_, err := c.kubectl("get", "serviceaccount", "default")
		return err
	})
	return c
}

// linkHost connects the node's namespace to the host with a veth pair of its own addresses.
func (c *cluster) linkHost() {
	t := c.n.t
	t.Helper()
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if ones, _ := r.Dst.Mask.Size(); r.Dst != nil && ones > 0 && r.Dst.Contains(net.ParseIP(clusterNodeIP)) {
			t.Fatalf("the host already routes %s (%s): the cluster's link would shadow it", r.Dst, r)
		}
	}
	nodeNS, err := os.Open(c.n.nodeNS)
	if err != nil {
		t.Fatal(err)
	}
	defer nodeNS.Close()
	// The node's end is made in its namespace: the host has an eth0 of its own.
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: clusterHostLink}, PeerName: clusterNodeLink,
		PeerNamespace: netlink.NsFd(int(nodeNS.Fd()))}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("the cluster's host link %s: %v (is a cluster up already? hack/cluster.sh down)", clusterHostLink, err)
	}
	t.Cleanup(func() {
		if link, err := netlink.LinkByName(clusterHostLink); err == nil {
			_ = netlink.LinkDel(link)
		}
	})
	setUp := func(name, ip string) error {
		link, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		addr, err := netlink.ParseAddr(fmt.Sprintf("%s/%d", ip, clusterLinkBits))
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("address %s on %s: %w", addr, name, err)
		}
		return netlink.LinkSetUp(link)
	}
	if err := setUp(clusterHostLink, clusterHostIP); err != nil {
		t.Fatal(err)
	}
	c.n.inNode(func() error { return setUp(clusterNodeLink, clusterNodeIP) })
}

// clusterPKI are the files the control plane authenticates with: a CA and the API server's
// certificate from it, the service-account signing key, and a bearer token per identity.
type clusterPKI struct {
	ca                    []byte // PEM
	caFile                string
	serverCert, serverKey string
	saKey                 string
	tokenFile             string
	tokens                map[string]string // by identity: admin, kubelet, controller-manager, scheduler
}

func (c *cluster) writePKI() clusterPKI {
	t := c.n.t
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
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(clusterNodeIP), net.ParseIP("10.96.0.1")},
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
	// The control plane's own components act as administrators; the kubelet is a node, which the
	// Node authorizer confines to its own pods.
	identities := []struct{ name, user, groups string }{
		{"admin", "admin", "system:masters"},
		{"controller-manager", "system:kube-controller-manager", "system:masters"},
		{"scheduler", "system:kube-scheduler", "system:masters"},
		{"kubelet", "system:node:" + kubeletNodeName, "system:nodes"},
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
func (c *cluster) writeKubeconfig(name, server string, ca []byte, token string) string {
	c.n.t.Helper()
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
		c.n.t.Fatal(err)
	}
	return path
}

// run starts a control-plane process in the node's namespace, logging to <name>.log; it is stopped
// when the test ends, and its log's tail shown if the test failed.
func (c *cluster) run(name, binary string, args ...string) *testproc.Process {
	t := c.n.t
	t.Helper()
	logPath := filepath.Join(c.dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command("nsenter", append([]string{"--net=" + c.n.nodeNS, "--", binary}, args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	proc, err := testproc.Start(cmd)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() {
		_, _ = proc.Stop(30 * time.Second)
		if t.Failed() {
			data, _ := os.ReadFile(logPath)
			t.Logf("%s log (last 60 lines):\n%s", name, lastLines(string(data), 60))
		}
	})
	return proc
}

// waitFor polls ready for up to three minutes (the API server's first start migrates etcd and
// installs every bootstrap object; slow on two busy cores).
func (c *cluster) waitFor(what string, ready func() error) {
	c.n.t.Helper()
	var last error
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if last = ready(); last == nil {
			return
		}
	}
	c.n.t.Fatalf("%s: not within 3 minutes: %v", what, last)
}

// kubectl runs bin/kubectl on the host with the administrator's kubeconfig.
func (c *cluster) kubectl(args ...string) (string, error) {
	cmd := exec.Command(bins.kubectl, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.kubeconfig)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// httpOK GETs url in the node's namespace and wants 200.
func httpOK(n *node, url string) error {
	status, body, err := n.httpGetInNode(url)
	if err == nil && status != 200 {
		err = fmt.Errorf("%s: %d %s", url, status, body)
	}
	return err
}
