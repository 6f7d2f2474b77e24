package nocloud

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/internal/fat12"
)

// twoNICs is a root password, a data disk to mount, a static NIC and a DHCP one: every part of
// cocoon's templates.
var twoNICs = &Config{
	InstanceID: "0f3c9a", Hostname: "web", Username: "root", Password: "it's", DNS: []string{"8.8.8.8", "1.1.1.1"},
	Networks: []NIC{{MAC: "aa:bb:cc:dd:ee:01", IP: "10.0.0.2", Prefix: 24, Gateway: "10.0.0.1"}, {MAC: "aa:bb:cc:dd:ee:02"}},
	Mounts:   []Mount{{Device: "/dev/disk/by-id/virtio-data1", MountPoint: "/mnt/it's", FSType: "ext4", Options: "defaults,nofail"}},
}

const twoNICsNetworkConfig = `version: 2
ethernets:
  id0:
    match:
      macaddress: "aa:bb:cc:dd:ee:01"
    addresses:
      - 10.0.0.2/24
    routes:
      - to: default
        via: 10.0.0.1
    nameservers:
      addresses:
        - 8.8.8.8
        - 1.1.1.1
  id1:
    match:
      macaddress: "aa:bb:cc:dd:ee:02"
    dhcp4: true
`

// TestFilesAreCocoons pins the files to what cocoon's templates render for the same input.
func TestFilesAreCocoons(t *testing.T) {
	for _, tc := range []struct {
		rev                     Revision
		userData, networkConfig string
	}{
		{V038, `#cloud-config
chpasswd:
  expire: false
  list:
    - 'root:it''s'
ssh_pwauth: true
disable_root: false
mounts:
  - ['/dev/disk/by-id/virtio-data1', '/mnt/it''s', 'ext4', 'defaults,nofail', '0', '2']
write_files:
  - path: /etc/systemd/network/15-cocoon-id0.network
    owner: root:root
    permissions: '0644'
    content: |
      [Match]
      MACAddress=aa:bb:cc:dd:ee:01

      [Network]
      Address=10.0.0.2/24
      Gateway=10.0.0.1
      DNS=8.8.8.8
      DNS=1.1.1.1
      RequiredForOnline=yes
  - path: /etc/systemd/network/15-cocoon-id1.network
    owner: root:root
    permissions: '0644'
    content: |
      [Match]
      MACAddress=aa:bb:cc:dd:ee:02

      [Network]
      DHCP=ipv4
      RequiredForOnline=no
`, twoNICsNetworkConfig},
		{V05, `#cloud-config
ssh_pwauth: true
chpasswd:
  expire: false
  list:
    - 'root:it''s'
disable_root: false
mounts:
  - ['/dev/disk/by-id/virtio-data1', '/mnt/it''s', 'ext4', 'defaults,nofail', '0', '2']
write_files:
  - path: /etc/systemd/network/15-cocoon-id0.network
    owner: root:root
    permissions: '0644'
    content: |
      [Match]
      MACAddress=aa:bb:cc:dd:ee:01

      [Link]
      RequiredForOnline=yes

      [Network]
      Address=10.0.0.2/24
      Gateway=10.0.0.1
      DNS=8.8.8.8
      DNS=1.1.1.1
  - path: /etc/systemd/network/15-cocoon-id1.network
    owner: root:root
    permissions: '0644'
    content: |
      [Match]
      MACAddress=aa:bb:cc:dd:ee:02

      [Link]
      RequiredForOnline=no

      [Network]
      DHCP=ipv4
`, twoNICsNetworkConfig + `  zfallback:
    match:
      name: "e*"
    dhcp4: true
    optional: true
`},
	} {
		files := Files(twoNICs, tc.rev)
		for name, want := range map[string]string{
			MetaDataFile:      "instance-id: 0f3c9a\nlocal-hostname: web\n",
			UserDataFile:      tc.userData,
			NetworkConfigFile: tc.networkConfig,
		} {
			if got := string(files[name]); got != want {
				t.Errorf("revision %d %s:\n%s\nwant\n%s", tc.rev, name, got, want)
			}
		}
		if len(files) != 3 {
			t.Errorf("revision %d: %d files", tc.rev, len(files))
		}
	}
}

// TestUserDataPasswords: how each revision hands a password to a user.
func TestUserDataPasswords(t *testing.T) {
	const runcmd = `runcmd:
  - [sh, -c, 'id dev >/dev/null 2>&1 || useradd -m -s /bin/bash -N dev']
  - [usermod, -aG, sudo, 'dev']
  - [sh, -c, 'echo ''dev:p4ss'' | chpasswd']
  - [sh, -c, 'echo ''dev ALL=(ALL) NOPASSWD:ALL'' > /etc/sudoers.d/cocoon-dev']
`
	for _, tc := range []struct {
		rev            Revision
		user, password string
		want           string
	}{
		{V038, "dev", "p4ss", "#cloud-config\nchpasswd:\n  expire: false\n  list:\n    - 'dev:p4ss'\nssh_pwauth: true\n" + runcmd},
		{V05, "dev", "p4ss", "#cloud-config\nssh_pwauth: true\n" + runcmd},
		// A password without a user: v0.3.8 writes it for a user named "", v0.5 not at all.
		{V038, "", "p4ss", "#cloud-config\nchpasswd:\n  expire: false\n  list:\n    - ':p4ss'\nssh_pwauth: true\n"},
		{V05, "", "p4ss", "#cloud-config\n"},
		{V038, "dev", "", "#cloud-config\n"},
		{V05, "dev", "", "#cloud-config\n"},
	} {
		cfg := &Config{InstanceID: "i", Hostname: "h", Username: tc.user, Password: tc.password}
		files := Files(cfg, tc.rev)
		if got := string(files[UserDataFile]); got != tc.want {
			t.Errorf("revision %d, user %q, password %q:\n%s\nwant\n%s", tc.rev, tc.user, tc.password, got, tc.want)
		}
		if _, ok := files[NetworkConfigFile]; ok {
			t.Errorf("revision %d: network-config without NICs", tc.rev)
		}
	}
}

func TestReadWhatWriteWrote(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cidata.img")
	f, err := os.Create(path) //nolint:gosec // test file
	if err != nil {
		t.Fatal(err)
	}
	if err := Write(f, twoNICs, V05, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	seed, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	want := Files(twoNICs, V05)
	for name, got := range map[string][]byte{MetaDataFile: seed.MetaData, UserDataFile: seed.UserData, NetworkConfigFile: seed.NetworkConfig} {
		if !bytes.Equal(got, want[name]) {
			t.Errorf("%s: %q, want %q", name, got, want[name])
		}
	}
	if seed.VendorData != nil {
		t.Errorf("vendor-data %q", seed.VendorData)
	}
}

// TestReadRefusesWhatIsNoSeed: the JSON the simulator once wrote, a volume with another label,
// and one without meta-data are no NoCloud seed.
func TestReadRefusesWhatIsNoSeed(t *testing.T) {
	dir := t.TempDir()
	image := func(label string, files map[string][]byte) []byte {
		var b bytes.Buffer
		if err := fat12.Write(&b, label, files, time.Now()); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	both := map[string][]byte{MetaDataFile: []byte("instance-id: i\n"), UserDataFile: []byte("#cloud-config\n")}
	for name, tc := range map[string]struct {
		data []byte
		err  string
	}{
		"json":         {[]byte(`{"instance-id":"i","hostname":"web","networks":[]}`), "boot sector"},
		"label":        {image("CONFIG-2", both), `volume label "CONFIG-2"`},
		"no meta-data": {image("cidata", map[string][]byte{UserDataFile: nil}), "no meta-data"},
		"no user-data": {image("CIDATA", map[string][]byte{MetaDataFile: nil}), "no user-data"},
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, tc.data, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Read(path); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want an error with %q", name, err, tc.err)
		}
	}
	// A lower-case label (which the writer does not make) and an empty user-data are a seed.
	img := image("CIDATA", map[string][]byte{MetaDataFile: []byte("x: y\n"), UserDataFile: nil})
	copy(img[13*512:], "cidata") // the root directory's label entry
	path := filepath.Join(dir, "lower")
	if err := os.WriteFile(path, img, 0o600); err != nil {
		t.Fatal(err)
	}
	if seed, err := Read(path); err != nil || string(seed.MetaData) != "x: y\n" || seed.UserData == nil || len(seed.UserData) != 0 {
		t.Fatalf("%+v, %v", seed, err)
	}
}
