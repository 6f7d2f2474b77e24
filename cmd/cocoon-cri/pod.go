package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/cocoonstack/cocoon-cri/cri/vmruntime"
)

// newPodCommand is the operator's hibernate and wake of one VM pod on this node
// (docs/hibernation.md), and its pod checkpoint and restore (docs/checkpoint.md), through the
// daemon on --socket.
func newPodCommand(o *options) *cobra.Command {
	cmd := &cobra.Command{Use: "pod", Short: "Control the VM pods of a running cocoon-cri"}
	cmd.AddCommand(newPodCheckpointCommand(o), newPodRestoreCommand(o))
	for _, c := range []struct {
		use, short string
		do         func(context.Context, grpc.ClientConnInterface, string) (string, error)
	}{
		{"hibernate POD", "Hibernate a VM pod now: its VM is saved and its hypervisor ends; it wakes on use", vmruntime.HibernatePod},
		{"wake POD", "Wake a hibernated VM pod now", vmruntime.WakePod},
	} {
		cmd.AddCommand(&cobra.Command{
			Use:   c.use,
			Short: c.short,
			Long:  c.short + ".\nPOD is NAMESPACE/NAME or the pod sandbox's ID (or a unique prefix of it). Prints the container ID.",
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				conn, err := dialDaemon(o.socket)
				if err != nil {
					return err
				}
				defer conn.Close()
				id, err := c.do(cmd.Context(), conn, args[0])
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), id)
				return nil
			},
		})
	}
	return cmd
}
