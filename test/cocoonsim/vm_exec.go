package cocoonsim

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
)

// cocoon v0.5's `vm exec` (cmd/vm/exec.go): it runs a command in the guest through cocoon-agent
// on the VM's hybrid vsock socket. v0.3.8 has no such command.

var (
	errNoCommand = errors.New("exec: no command given")
	// errNotRunning is newer cocoon's hypervisor.ErrNotRunning (v0.3.8 words it errVMNotRunning).
	errNotRunning         = errors.New("vm not running")
	errVsockNotConfigured = errors.New("vsock not configured for this VM")
)

// agentRetryHint ends every failure to reach the agent.
const agentRetryHint = "cocoon-agent may still be starting; retry shortly"

// execExitError carries the guest command's non-zero exit code out as cocoon's own exit code.
type execExitError struct{ code int }

func (e *execExitError) Error() string { return fmt.Sprintf("exit code %d", e.code) }

// execCommand is cocoon's `vm exec`, with its usage, arguments and flags.
func (a *app) execCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "exec [flags] VM -- COMMAND [ARGS...]",
		Short: "Run a command inside a running VM via cocoon-agent (vsock)",
		Args:  cobra.MinimumNArgs(2),
		RunE:  a.vmExec,
	}
	cmd.Flags().StringArrayP("env", "e", nil, "extra env var KEY=VALUE (repeatable)")
	cmd.Flags().BoolP("interactive", "i", false, "attach the caller's stdin to the command (otherwise stdin closes immediately)")
	return cmd
}

// vmExec checks in cocoon's order: the command, the VM (which must be running and have a vsock
// socket), the --env pairs, the agent; then runs the command with its streams attached. A
// non-zero exit of the command becomes this process's exit code, without an "Error:" line.
func (a *app) vmExec(cmd *cobra.Command, args []string) error {
	ref, argv := args[0], args[1:]
	if argv[0] == "--" {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		return errNoCommand
	}
	vm, err := a.resolveRunningVM(cmd, "exec", ref)
	if err != nil {
		return err
	}
	vsock := vsockSocket(vm)
	if vsock == "" {
		return fmt.Errorf("exec: %w (recreate the VM to enable agent exec)", errVsockNotConfigured)
	}
	pairs, _ := cmd.Flags().GetStringArray("env")
	env, err := parseExecEnv(pairs)
	if err != nil {
		return err
	}
	ctx, stop := stopOnHangup(cmd.Context(), cmd.OutOrStdout())
	defer stop()
	conn, err := dialHybridVsock(ctx, vsock, guest.AgentPort)
	if err != nil {
		return fmt.Errorf("exec: dial agent: %w (%s)", err, agentRetryHint)
	}
	defer conn.Close() //nolint:errcheck
	var stdin io.Reader
	if interactive, _ := cmd.Flags().GetBool("interactive"); interactive {
		stdin = cmd.InOrStdin()
	}
	code, err := guest.RunInGuest(ctx, conn, argv, env, stdin, cmd.OutOrStdout(), cmd.ErrOrStderr())
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	if code != 0 {
		cmd.SilenceErrors = true
		return &execExitError{code: code}
	}
	return nil
}

// resolveRunningVM is newer cocoon's: the owning backend, its record, and the record's state
// (not reconciled: a VM whose hypervisor died still counts as running and fails at the dial).
func (a *app) resolveRunningVM(cmd *cobra.Command, op, ref string) (*cocoon.VM, error) {
	backends, err := allBackends(a.conf, a.log)
	if err != nil {
		return nil, err
	}
	owner, err := resolveVMOwner(cmd.Context(), backends, ref)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	vm, err := owner.inspect(cmd.Context(), ref)
	if err != nil {
		return nil, fmt.Errorf("%s: inspect: %w", op, err)
	}
	if vm.State != cocoon.VMStateRunning {
		return nil, fmt.Errorf("%s: %w", op, errNotRunning)
	}
	return vm, nil
}

// vsockSocket is newer cocoon's VsockSocket of a VM: the run dir's hybrid vsock socket, when
// the record says running (as for socket_path) and the socket exists.
func vsockSocket(vm *cocoon.VM) string {
	if vm.SocketPath == "" {
		return ""
	}
	path := filepath.Join(filepath.Dir(vm.SocketPath), guest.VsockSocketName)
	if _, err := os.Stat(path); err != nil {
		return ""
	}
	return path
}

// parseExecEnv reads the --env pairs; a later pair for the same key wins.
func parseExecEnv(pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	env := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--env %q must be KEY=VALUE", p)
		}
		env[k] = v
	}
	return env, nil
}
