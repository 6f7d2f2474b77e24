// Command cocoon-cri is a Kubernetes CRI runtime that runs pods as cocoon MicroVMs. Without a
// subcommand it serves the CRI on a unix socket; "cocoon-cri image import" loads an image into a
// running daemon, and "cocoon-cri image push" pushes a snapshot archive to a registry.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/cocoonstack/cocoon-cri/tapmanager"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "0.1.0-dev"

// envPrefix is the prefix of the environment variables that mirror the flags.
const envPrefix = "COCOON_CRI_"

func main() {
	// cocoon runs this executable as the attach plugin through a link of that name.
	if filepath.Base(os.Args[0]) == tapmanager.AttachPluginName {
		tapmanager.AttachPluginMain()
		return
	}
	if err := newRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "cocoon-cri:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	opts := defaultOptions()
	cmd := &cobra.Command{
		Use:   "cocoon-cri",
		Short: "Kubernetes CRI runtime that runs pods as cocoon MicroVMs",
		Long: "cocoon-cri serves the Kubernetes CRI (runtime.v1) on a unix socket and runs each pod's\n" +
			"container as a cocoon MicroVM. Every flag can also be set with an environment variable\n" +
			"(COCOON_CRI_ and the flag name in upper case, e.g. COCOON_CRI_STATE_DIR) or in the YAML\n" +
			"file given by --config, whose keys are the flag names.",
		Version:       version,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDaemon(cmd.Context(), opts)
		},
	}
	cmd.SetVersionTemplate("cocoon-cri {{.Version}}\n")
	opts.addFlags(cmd)
	cmd.AddCommand(newImageCommand(opts), newPodCommand(opts))
	return cmd
}
