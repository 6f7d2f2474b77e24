package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cocoonstack/cocoon-cri/cri/vmruntime"
	"github.com/cocoonstack/cocoon-cri/imagestore"
)

func newImageCommand(o *options) *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Manage the images of a running cocoon-cri"}
	var ref string
	imp := &cobra.Command{
		Use:   "import --ref REF FILE",
		Short: "Import a cocoon snapshot archive or a qcow2 cloud image under a CRI image reference",
		Long: "Import a cocoon snapshot archive (as cocoon snapshot export writes it) or a qcow2 cloud\n" +
			"image, plain or gzip-compressed, into the cocoon-cri daemon on --socket, and record it under\n" +
			"REF. Pods then use REF as their image: a snapshot is cloned, a cloud image is booted.\n" +
			"This is how images reach nodes without a registry.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if ref == "" {
				return fmt.Errorf("--ref is required")
			}
			return importImage(cmd, o.socket, ref, args[0])
		},
	}
	imp.Flags().StringVar(&ref, "ref", "", "image reference to record the image under, e.g. registry.example/ubuntu:24.04")
	cmd.AddCommand(imp)
	return cmd
}

// importImage hashes the file, then streams it to the daemon, which checks the digest as cocoon
// reads it.
func importImage(cmd *cobra.Command, socket, ref, path string) error {
	digest, err := imagestore.FileDigest(path)
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", socket, err)
	}
	defer conn.Close()
	id, err := vmruntime.ImportImage(cmd.Context(), conn, ref, digest, f)
	if err != nil {
		return fmt.Errorf("import %s: %w", path, err)
	}
	fmt.Fprintln(cmd.OutOrStdout(), id)
	return nil
}
