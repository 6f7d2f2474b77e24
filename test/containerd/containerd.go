// Package containerdtest runs a real containerd for the end-to-end tests, as the container runtime
// a node already has beside cocoon-cri: in the test node's network namespace, with every file
// (root, state, socket, runc state, pod network namespaces) under one directory, images imported
// from tarballs the package builds (no registry), and everything it started stopped by PID when
// the test ends, also when the test fails or killed containerd.
package containerdtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// The images every Daemon has: critest's default test image (busybox-static with its applets) and
// the pinned sandbox image.
const (
	BusyboxImage = "registry.k8s.io/e2e-test-images/busybox:1.29-2"
	PauseImage   = "registry.k8s.io/pause:3.10"
)

// Options describe the containerd to run.
type Options struct {
	// Dir holds everything the daemon writes; it must not exist yet or be empty. Keep it short:
	// the socket's path must stay under 108 bytes.
	Dir string
	// NetNS is the network namespace (a path) the daemon runs in: pods get their networks there,
	// and stream URLs point at its loopback.
	NetNS string
	// CNIConfDir and CNIBinDirs are the node's CNI configuration and plugins.
	CNIConfDir string
	CNIBinDirs []string
	// BinDir holds containerd, containerd-shim-runc-v2 and ctr (make tools builds them); empty is
	// $COCOON_CRI_BIN or the module's bin/.
	BinDir string
	// PlainHTTPRegistries (host:port) are pulled from over plain HTTP, as a cluster's own
	// registry is.
	PlainHTTPRegistries []string
	// SystemdCgroup configures runc with the systemd cgroup driver, as on a kubeadm node. No pod
	// starts then without systemd; containerd itself does, and reports the driver.
	SystemdCgroup bool
}

// Daemon is a running (or killed) containerd.
type Daemon struct {
	t       testproc.TB
	opts    Options
	config  string
	logFile string
	proc    *testproc.Process
	// ownsShimSocketDir: the host had no shim socket directory before this daemon; it goes again.
	ownsShimSocketDir bool
	// hadCgroups are the namespace's parent cgroups that existed before this daemon; the others
	// go again when empty.
	hadCgroups []string
}

// Start writes containerd's configuration, starts it, waits until its CRI service answers and
// imports the busybox and pause images. The test's cleanup stops it and whatever it started.
func Start(t testproc.TB, opts Options) *Daemon {
	t.Helper()
	if opts.Dir == "" || opts.NetNS == "" || opts.CNIConfDir == "" {
		t.Fatal("containerdtest: Dir, NetNS and CNIConfDir are required")
	}
	if opts.BinDir == "" {
		opts.BinDir = defaultBinDir(t)
	}
	for _, tool := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
		if _, err := os.Stat(filepath.Join(opts.BinDir, tool)); err != nil {
			t.Fatalf("containerdtest: %v: run make tools (make test does)", err)
		}
	}
	if err := os.MkdirAll(opts.Dir, 0o711); err != nil {
		t.Fatal(err)
	}
	d := &Daemon{t: t, opts: opts, config: filepath.Join(opts.Dir, "config.toml"), logFile: filepath.Join(opts.Dir, "containerd.log")}
	if _, err := os.Stat(filepath.Dir(shimSocketDir)); errors.Is(err, os.ErrNotExist) {
		d.ownsShimSocketDir = true
	}
	d.hadCgroups = namespaceCgroups()
	t.Cleanup(d.cleanup)
	if err := os.WriteFile(d.config, []byte(configTOML(opts)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, host := range opts.PlainHTTPRegistries {
		hostDir := filepath.Join(opts.Dir, "certs.d", host)
		if err := os.MkdirAll(hostDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(hostDir, "hosts.toml"), []byte(hostsTOML(host)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d.launch()
	d.importImages()
	return d
}

// Endpoint is the CRI endpoint of the daemon, as crictl and cocoon-cri take it.
func (d *Daemon) Endpoint() string { return "unix://" + d.socket() }

func (d *Daemon) socket() string { return filepath.Join(d.opts.Dir, "containerd.sock") }

// PID is the daemon's process ID; 0 when it is not running.
func (d *Daemon) PID() int {
	if d.proc == nil {
		return 0
	}
	return d.proc.PID()
}

// Images are the busybox and the pause image references the daemon has.
func (d *Daemon) Images() (busybox, pause string) { return BusyboxImage, PauseImage }

// Log is what the daemon wrote so far, over all its runs.
func (d *Daemon) Log() string {
	data, _ := os.ReadFile(d.logFile)
	return string(data)
}

// Kill stops the daemon with SIGKILL, as a crash would: its shims and pods go on running.
func (d *Daemon) Kill() {
	if d.proc == nil {
		return
	}
	d.proc.Kill()
	d.proc = nil
}

// Restart starts the daemon again after Kill or Stop, on the same state, and waits for it.
func (d *Daemon) Restart() {
	d.t.Helper()
	if d.proc != nil {
		d.t.Fatal("containerdtest: Restart of a running daemon")
	}
	d.launch()
}

// Stop ends the daemon with SIGTERM, as systemd would; pods go on running.
func (d *Daemon) Stop() {
	d.t.Helper()
	if d.proc == nil {
		return
	}
	clean, _ := d.proc.Stop(30 * time.Second)
	d.proc = nil
	if !clean {
		d.t.Errorf("containerd ignored SIGTERM for 30 s")
	}
}

// launch runs containerd in the node's namespace (nsenter execs it, so the PID is containerd's)
// and waits until its CRI service answers.
func (d *Daemon) launch() {
	d.t.Helper()
	logFile, err := os.OpenFile(d.logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		d.t.Fatal(err)
	}
	defer logFile.Close()
	// Not `ip netns exec`: it remounts /sys, and runc then finds no cgroup mount.
	cmd := exec.Command("nsenter", "--net="+d.opts.NetNS, "--", filepath.Join(d.opts.BinDir, "containerd"), "--config", d.config)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// containerd finds its runc shim on PATH.
	cmd.Env = append(os.Environ(), "PATH="+d.opts.BinDir+":"+os.Getenv("PATH"))
	if d.proc, err = testproc.Start(cmd); err != nil {
		d.t.Fatal(err)
	}
	if err := d.proc.WaitReady(time.Minute, 100*time.Millisecond, d.ping); err != nil {
		d.proc = nil
		d.t.Fatalf("containerd's CRI service: %v\n%s", err, d.Log())
	}
}

// ping asks containerd's CRI runtime service for its version.
func (d *Daemon) ping() error {
	return d.withCRI(5*time.Second, func(ctx context.Context, rt runtimeapi.RuntimeServiceClient) error {
		_, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
		return err
	})
}

// withCRI calls fn with a CRI runtime client of the daemon, under a deadline.
func (d *Daemon) withCRI(timeout time.Duration, fn func(context.Context, runtimeapi.RuntimeServiceClient) error) error {
	conn, err := grpc.NewClient(d.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return fn(ctx, runtimeapi.NewRuntimeServiceClient(conn))
}

// ctr runs containerd's own client against the daemon, in the CRI's namespace.
// Tag gives an image the daemon has one more reference, as `ctr images tag` does.
func (d *Daemon) Tag(source, target string) {
	d.t.Helper()
	if err := d.ctr("images", "tag", source, target); err != nil {
		d.t.Fatalf("containerdtest: %v", err)
	}
}

func (d *Daemon) ctr(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(d.opts.BinDir, "ctr"), append([]string{"--address", d.socket(), "--namespace", "k8s.io"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// cleanup removes the pods through containerd while it runs, stops it, then kills what is left
// of the pods (a killed containerd leaves its shims and containers running), removes their
// cgroups and unmounts everything under Dir.
func (d *Daemon) cleanup() {
	if d.proc != nil {
		if err := d.removePods(); err != nil {
			d.t.Errorf("containerdtest: remove pods: %v", err)
		}
		d.Stop()
	}
	if err := d.killTasks(); err != nil {
		d.t.Errorf("containerdtest: %v", err)
	}
	if err := unmountUnder(d.opts.Dir); err != nil {
		d.t.Errorf("containerdtest: %v", err)
	}
	if d.ownsShimSocketDir {
		removeShimSocketDir()
	}
	for _, cg := range namespaceCgroups() {
		if !slices.Contains(d.hadCgroups, cg) {
			_ = os.Remove(cg)
		}
	}
	if d.t.Failed() {
		d.t.Logf("containerd log:\n%s", d.Log())
	}
	if err := os.RemoveAll(d.opts.Dir); err != nil {
		d.t.Errorf("containerdtest: remove %s: %v", d.opts.Dir, err)
	}
}

// removePods stops and removes every sandbox the daemon has.
func (d *Daemon) removePods() error {
	return d.withCRI(5*time.Minute, func(ctx context.Context, rt runtimeapi.RuntimeServiceClient) error {
		resp, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
		if err != nil {
			return err
		}
		var errs []error
		for _, pod := range resp.Items {
			if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod.Id}); err != nil {
				errs = append(errs, fmt.Errorf("stop %s: %w", pod.Id, err))
				continue
			}
			if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod.Id}); err != nil {
				errs = append(errs, fmt.Errorf("remove %s: %w", pod.Id, err))
			}
		}
		return errors.Join(errs...)
	})
}

func defaultBinDir(t testproc.TB) string {
	if dir := os.Getenv("COCOON_CRI_BIN"); dir != "" {
		return dir
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("containerdtest: find the module root: %v", err)
	}
	return filepath.Join(filepath.Dir(strings.TrimSpace(string(out))), "bin")
}
