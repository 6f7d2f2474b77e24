package cocoonsim_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/internal/nsthread"
)

func TestGuestServesHTTPAndSSH(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	requireSSHD(t)
	lab := newNetLab(t, labOptions{})
	root := newSSHKey(t)
	lab.seedImage("img", guest.Spec{HTTPPort: 80, SSHAuthorizedKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(root.PublicKey())))})
	vm := lab.runVM("img", "web", "--cpu", "1")
	ip := vm.NetworkConfigs[0].Network.IP

	status, body := lab.httpGet(t, "http://"+ip+"/")
	if status != http.StatusOK || !strings.Contains(body, "cocoon-sim guest web") {
		t.Fatalf("GET / from the guest's web server: %d %q", status, body)
	}
	if status, _ := lab.httpGet(t, "http://"+ip+"/nosuch"); status != http.StatusNotFound {
		t.Fatalf("GET /nosuch: %d", status)
	}

	// The guest's sshd has a host key of its own and lets root in with the image's key only.
	lab.sshHostname(t, vm, root, "web")
	if c, err := lab.sshDial(ip, newSSHKey(t), ssh.InsecureIgnoreHostKey()); err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
		if c != nil {
			_ = c.Close()
		}
		t.Fatalf("ssh with another key: %v, want refused", err)
	}
}

// A cloud image has its guest behaviour in a qcow2 header extension; one without gets the
// default guest, which serves neither HTTP nor SSH.
func TestCloudImageGuestBehaviourComesFromItsQCOW2(t *testing.T) {
	requireTool(t, "qemu-img")
	requireSSHD(t)
	lab := newNetLab(t, labOptions{})
	root := newSSHKey(t)
	lab.importCloudImage("web-cloud", guest.Spec{HTTPPort: 80, SSHAuthorizedKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(root.PublicKey())))})
	lab.importCloudImage("plain-cloud", guest.Spec{})

	lab.ok("vm", "create", "--name", "web", "--cpu", "1", "--storage", "10G", "web-cloud")
	lab.ok("vm", "start", "web")
	vm := lab.inspect("web")
	ip := vm.NetworkConfigs[0].Network.IP
	if status, body := lab.httpGet(t, "http://"+ip+"/"); status != http.StatusOK || !strings.Contains(body, "cocoon-sim guest web") {
		t.Fatalf("GET / from the cloud image guest: %d %q", status, body)
	}
	lab.sshHostname(t, vm, root, "web")

	plain := lab.runVM("plain-cloud", "plain", "--cpu", "1")
	plainIP := plain.NetworkConfigs[0].Network.IP
	lab.mustProbe(lab.ns, plainIP, "plain "+plainIP)
	for _, port := range []string{"80", "22"} {
		if conn, err := lab.dialFromLab(net.JoinHostPort(plainIP, port)); err == nil {
			_ = conn.Close()
			t.Errorf("the default guest answers on port %s", port)
		}
	}
	if _, err := os.Stat(filepath.Join(lab.run, "cloudhypervisor", plain.ID, guest.SpecFile)); err == nil {
		t.Errorf("a cloud image without the extension gave its VM a %s", guest.SpecFile)
	}
	lab.ok("vm", "rm", "--force", "web", "plain")
	lab.checkNoNetworkLeft()
}

func requireSSHD(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/usr/sbin/sshd"); err != nil {
		t.Skip("sshd not installed (Debian package openssh-server; hack/setup.sh installs it)")
	}
}

// sshHostname logs in to the guest's sshd as root with key, checking the host key the guest
// made at its first boot, and wants hostname to print want.
func (lab *netLab) sshHostname(t *testing.T, vm cocoon.VM, key ssh.Signer, want string) {
	t.Helper()
	hostKey, err := os.ReadFile(filepath.Join(lab.run, "cloudhypervisor", vm.ID, "guest", "ssh", "ssh_host_ed25519_key"))
	if err != nil {
		t.Fatal(err)
	}
	hostSigner, err := ssh.ParsePrivateKey(hostKey)
	if err != nil {
		t.Fatal(err)
	}
	client, err := lab.sshDial(vm.NetworkConfigs[0].Network.IP, key, ssh.FixedHostKey(hostSigner.PublicKey()))
	if err != nil {
		t.Fatalf("ssh as root with the image's key: %v", err)
	}
	defer client.Close() //nolint:errcheck
	session, err := client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	out, err := session.Output("hostname")
	if err != nil || string(out) != want+"\n" {
		t.Fatalf("ssh hostname: %q, %v (want %s)", out, err, want)
	}
}

func newSSHKey(t *testing.T) ssh.Signer {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return signer
}

// dialFromLab opens a TCP connection from inside the lab's namespace.
func (lab *netLab) dialFromLab(addr string) (net.Conn, error) {
	var conn net.Conn
	err := nsthread.In(lab.ns, func() error {
		var err error
		conn, err = net.DialTimeout("tcp", addr, dialTimeout)
		return err
	})
	return conn, err
}

// httpGet fetches url from inside the lab's namespace, retrying while nothing answers yet.
func (lab *netLab) httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	hc := &http.Client{Timeout: patience, Transport: &http.Transport{
		DialContext: func(_ context.Context, _, addr string) (net.Conn, error) { return lab.dialFromLab(addr) },
	}}
	var resp *http.Response
	eventually(t, "an answer from "+url, func() bool {
		var err error
		resp, err = hc.Get(url) //nolint:noctx // bounded by the client's timeout
		return err == nil
	})
	defer resp.Body.Close() //nolint:errcheck
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// sshDial logs in as root at ip:22 from inside the lab's namespace.
func (lab *netLab) sshDial(ip string, key ssh.Signer, hostKey ssh.HostKeyCallback) (*ssh.Client, error) {
	addr := net.JoinHostPort(ip, "22")
	conn, err := lab.dialFromLab(addr)
	if err != nil {
		return nil, err
	}
	_ = conn.SetDeadline(time.Now().Add(patience))
	c, chans, reqs, err := ssh.NewClientConn(conn, addr, &ssh.ClientConfig{
		User:            "root",
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(key)},
		HostKeyCallback: hostKey,
	})
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	return ssh.NewClient(c, chans, reqs), nil
}
