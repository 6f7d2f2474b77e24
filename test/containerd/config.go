package containerdtest

import (
	"fmt"
	"path/filepath"
	"strings"
)

// configTOML is containerd's configuration (version 3, containerd 2.x): every path under Dir,
// the CRI plugin with the node's CNI, Debian's runc, the imported pause image pinned as the
// sandbox image, and what this kind of host needs: root without CAP_SYS_RESOURCE cannot lower
// oom_score_adj (restrict_oom_score_adj), and network namespaces live under the state directory
// instead of the host's /var/run/netns. NRI and CDI are off: nothing here uses them.
func configTOML(o Options) string {
	dir := func(name string) string { return filepath.Join(o.Dir, name) }
	binDirs := make([]string, len(o.CNIBinDirs))
	for i, d := range o.CNIBinDirs {
		binDirs[i] = fmt.Sprintf("%q", d)
	}
	return fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q
temp = %[3]q

[grpc]
  address = %[4]q

[ttrpc]
  address = %[5]q

[debug]
  level = "info"

[plugins.'io.containerd.internal.v1.opt']
  path = %[6]q

[plugins.'io.containerd.nri.v1.nri']
  disable = true

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = %[12]q

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = %[7]q

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_cdi = false

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = [%[8]s]
  conf_dir = %[9]q
  max_conf_num = 1

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = "/usr/sbin/runc"
  Root = %[10]q
  SystemdCgroup = %[11]t
`, dir("root"), dir("state"), dir("tmp"), filepath.Join(o.Dir, "containerd.sock"), filepath.Join(o.Dir, "containerd.sock.ttrpc"),
		dir("opt"), PauseImage, strings.Join(binDirs, ", "), o.CNIConfDir, dir("runc"), o.SystemdCgroup, dir("certs.d"))
}

// hostsTOML is a registry's hosts.toml (under config_path/<host:port>/) that has containerd pull
// from it over plain HTTP.
func hostsTOML(hostport string) string {
	return fmt.Sprintf("server = %[1]q\n\n[host.%[1]q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://"+hostport)
}
