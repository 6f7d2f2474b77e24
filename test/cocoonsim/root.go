package cocoonsim

import (
	"fmt"
	"os"
	"runtime"

	"github.com/spf13/cobra"
)

// rootCommand builds the command tree of cocoon's cmd/root.go.
func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:          "cocoon",
		Short:        "Cocoon - MicroVM Engine",
		SilenceUsage: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return a.setup(cmd)
		},
	}
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)

	pf := root.PersistentFlags()
	pf.StringVar(&a.cfgFile, "config", "", "config file path")
	pf.String("root-dir", "", "root data directory")
	pf.String("run-dir", "", "runtime directory")
	pf.String("log-dir", "", "log directory")
	pf.String("cni-conf-dir", "", "CNI plugin config directory (default: /etc/cni/net.d)")
	pf.String("cni-bin-dir", "", "CNI plugin binary directory (default: /opt/cni/bin)")
	pf.String("dns", "", `DNS servers for VMs, comma or semicolon separated (default: "8.8.8.8,1.1.1.1")`)
	pf.String("log-level", "", `log level: debug, info, warn, error (default: "info")`)

	root.AddCommand(a.imageCommand(), a.vmCommand(), a.snapshotCommand())
	root.AddCommand(a.otherCommands()...)
	return root
}

// setup loads the configuration and the logger, as cocoon's initConfig does before every command.
func (a *app) setup(cmd *cobra.Command) error {
	conf, err := loadConfig(cmd.Flags(), a.cfgFile)
	if err != nil {
		return err
	}
	log, err := newLogger(conf.Log, a.stderr)
	if err != nil {
		return err
	}
	a.conf, a.log = conf, log
	return nil
}

// otherCommands are cocoon's gc, version and completion.
func (a *app) otherCommands() []*cobra.Command {
	return []*cobra.Command{
		{
			Use:   "gc",
			Short: "Remove unreferenced blobs, boot files, and VM dirs",
			RunE:  notSimulated("gc"),
		},
		{
			Use:   "version",
			Short: "Show version, git revision, and build timestamp",
			RunE: func(cmd *cobra.Command, _ []string) error {
				_, err := fmt.Fprintf(cmd.OutOrStdout(),
					"Version:        %s\nGit hash:       %s\nBuilt:          %s\nGolang version: %s\nOS/Arch:        %s/%s\n",
					a.profile.Version, "cocoon-sim", "cocoon-sim", runtime.Version(), runtime.GOOS, runtime.GOARCH)
				return err
			},
		},
		{
			Use:       "completion [bash|zsh|fish|powershell]",
			Short:     "Generate shell completion script",
			Args:      cobra.ExactArgs(1),
			ValidArgs: []string{"bash", "zsh", "fish", "powershell"},
			RunE: func(cmd *cobra.Command, args []string) error {
				root := cmd.Root()
				switch args[0] {
				case "bash":
					return root.GenBashCompletion(os.Stdout)
				case "zsh":
					return root.GenZshCompletion(os.Stdout)
				case "fish":
					return root.GenFishCompletion(os.Stdout, true)
				case "powershell":
					return root.GenPowerShellCompletionWithDesc(os.Stdout)
				default:
					return fmt.Errorf("unsupported shell: %s", args[0])
				}
			},
		},
	}
}

// notSimulated is the action of a cocoon command the simulator keeps for its flags and help but
// does not carry out (it needs a registry, a terminal or a real hypervisor).
func notSimulated(name string) func(*cobra.Command, []string) error {
	return func(*cobra.Command, []string) error {
		return fmt.Errorf("cocoon-sim: %q is not simulated", name)
	}
}
