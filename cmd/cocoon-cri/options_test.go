package main

import (
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
