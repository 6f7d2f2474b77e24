package main

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/cocoonstack/cocoon-cri/pkg/config"
)

// The shipped configuration file must load: every key a flag, every value valid.
func TestDeployConfigLoads(t *testing.T) {
	opts := defaultOptions()
	cmd := &cobra.Command{Use: "cocoon-cri"}
	opts.addFlags(cmd)
	if err := cmd.ParseFlags([]string{"--config", "../../deploy/config.yaml"}); err != nil {
		t.Fatal(err)
	}
	if err := config.Apply(cmd.Flags(), envPrefix, "config"); err != nil {
		t.Fatalf("deploy/config.yaml: %v", err)
	}
	if err := opts.validate(); err != nil {
		t.Fatalf("deploy/config.yaml: %v", err)
	}
	if opts.logFormat != "json" || opts.guestReadyTimeout != 2*time.Minute || opts.streamAddress != "127.0.0.1:0" {
		t.Fatalf("settings not taken from the file: %+v", opts)
	}
}

// --metrics-addr is off by default, comes from the environment like every flag, and must be a
// host:port, so a bare port is refused at start instead of failing to bind later.
func TestMetricsAddr(t *testing.T) {
	if opts, err := parse(); err != nil || opts.metricsAddr != "" {
		t.Fatalf("default: %q, %v; want off", opts.metricsAddr, err)
	}
	t.Setenv(config.EnvName(envPrefix, "metrics-addr"), "127.0.0.1:9809")
	if opts, err := parse(); err != nil || opts.metricsAddr != "127.0.0.1:9809" {
		t.Fatalf("from the environment: %q, %v", opts.metricsAddr, err)
	}
	if _, err := parse("--metrics-addr", "9809"); err == nil || !strings.Contains(err.Error(), "--metrics-addr") {
		t.Fatalf("a bare port: %v, want refused", err)
	}
	if opts, err := parse("--profiling"); err != nil || !opts.profiling {
		t.Fatalf("--profiling with the address from the environment: %v", err)
	}
	t.Setenv(config.EnvName(envPrefix, "metrics-addr"), "")
	if _, err := parse("--profiling"); err == nil || !strings.Contains(err.Error(), "--metrics-addr") {
		t.Fatalf("--profiling without --metrics-addr: %v, want refused", err)
	}
}

// --max-cocoon-calls is twice the CPUs by default, at least 4; 0 lifts the bound; less is refused.
func TestMaxCocoonCalls(t *testing.T) {
	if opts, err := parse(); err != nil || opts.maxCocoonCalls != max(4, 2*runtime.NumCPU()) {
		t.Fatalf("default: %d, %v", opts.maxCocoonCalls, err)
	}
	if opts, err := parse("--max-cocoon-calls", "0"); err != nil || opts.maxCocoonCalls != 0 {
		t.Fatalf("0: %d, %v", opts.maxCocoonCalls, err)
	}
	if _, err := parse("--max-cocoon-calls", "-2"); err == nil || !strings.Contains(err.Error(), "--max-cocoon-calls") {
		t.Fatalf("-2: %v, want refused", err)
	}
}

// parse reads args, the environment and the config file as the daemon does, and validates.
func parse(args ...string) (*options, error) {
	opts := defaultOptions()
	cmd := &cobra.Command{Use: "cocoon-cri"}
	opts.addFlags(cmd)
	if err := cmd.ParseFlags(args); err != nil {
		return opts, err
	}
	if err := config.Apply(cmd.Flags(), envPrefix, "config"); err != nil {
		return opts, err
	}
	return opts, opts.validate()
}

// Passthrough is off by default and set by flag, COCOON_CRI_PASSTHROUGH_ENDPOINT or the file; an
// endpoint that is no unix socket, or an unknown cgroup driver, is refused at start.
func TestPassthroughAndCgroupDriver(t *testing.T) {
	opts, err := parse()
	if err != nil || opts.passthroughEndpoint != "" || opts.cgroupDriver != "cgroupfs" {
		t.Fatalf("defaults: %q %q %v", opts.passthroughEndpoint, opts.cgroupDriver, err)
	}
	t.Setenv("COCOON_CRI_PASSTHROUGH_ENDPOINT", "unix:///run/containerd/containerd.sock")
	if opts, err := parse(); err != nil || opts.passthroughEndpoint != "unix:///run/containerd/containerd.sock" {
		t.Fatalf("from the environment: %q, %v", opts.passthroughEndpoint, err)
	}
	for _, bad := range [][]string{
		{"--passthrough-endpoint", "tcp://10.0.0.1:1234"},
		{"--passthrough-endpoint", "containerd.sock"},
		{"--cgroup-driver", "systemd.slice"},
	} {
		if _, err := parse(bad...); err == nil || !strings.Contains(err.Error(), bad[0]) {
			t.Errorf("%v: %v, want refused naming the flag", bad, err)
		}
	}
	if opts, err := parse("--cgroup-driver", "systemd"); err != nil || opts.cgroupDriver != "systemd" {
		t.Fatalf("--cgroup-driver systemd: %q %v", opts.cgroupDriver, err)
	}
}

// The node-wide guest password is gone: given by flag, environment or file, it is refused at
// start with the reason and what to use instead.
func TestGuestSSHPasswordIsRefused(t *testing.T) {
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte("guest-ssh-password: hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--guest-ssh-password", "hunter2"}, {"--config", file}} {
		if _, err := parse(args...); err == nil || !strings.Contains(err.Error(), "--guest-ssh-key-file") {
			t.Errorf("%v: %v, want refused, pointing to the key file", args, err)
		}
	}
	t.Setenv("COCOON_CRI_GUEST_SSH_PASSWORD", "hunter2")
	if _, err := parse(); err == nil || !strings.Contains(err.Error(), "was removed") {
		t.Errorf("from the environment: %v, want refused", err)
	}
}

// --warm-pool takes REF=N, repeated, from the environment, and from the config file as a map.
func TestWarmPoolOption(t *testing.T) {
	if opts, err := parse(); err != nil || len(opts.warmPools) != 0 {
		t.Fatalf("default: %v, %v; want none", opts.warmPools, err)
	}
	opts, err := parse("--warm-pool", "cocoon.local/a:v1=3", "--warm-pool", "registry.example.com:5000/b:v2=1")
	if err != nil || opts.warmPools["cocoon.local/a:v1"] != 3 || opts.warmPools["registry.example.com:5000/b:v2"] != 1 || len(opts.warmPools) != 2 {
		t.Fatalf("flags: %v, %v", opts.warmPools, err)
	}
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("warm-pool:\n  cocoon.local/a:v1: 2\n  cocoon.local/b:v1: 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if opts, err := parse("--config", cfg); err != nil || opts.warmPools["cocoon.local/a:v1"] != 2 || opts.warmPools["cocoon.local/b:v1"] != 5 {
		t.Fatalf("config file: %v, %v", opts.warmPools, err)
	}
	t.Setenv(config.EnvName(envPrefix, "warm-pool"), "cocoon.local/c:v1=4")
	if opts, err := parse(); err != nil || opts.warmPools["cocoon.local/c:v1"] != 4 {
		t.Fatalf("environment: %v, %v", opts.warmPools, err)
	}
	for _, bad := range []string{"cocoon.local/a:v1=-1", "cocoon.local/a:v1=1001", "cocoon.local/a:v1", "=3"} {
		if _, err := parse("--warm-pool", bad); err == nil || !strings.Contains(err.Error(), "warm-pool") {
			t.Errorf("--warm-pool %s: %v, want refused", bad, err)
		}
	}
}
