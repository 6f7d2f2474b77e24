package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/spf13/cobra"
	"golang.org/x/term"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cocoonstack/cocoon-cri/cri/vmruntime"
	"github.com/cocoonstack/cocoon-cri/imagestore"
	"github.com/cocoonstack/cocoon-cri/pkg/config"
)

func newImageCommand(o *options) *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Manage the images of a running cocoon-cri"}
	var ref string
	imp := &cobra.Command{
		Use:   "import --ref REF FILE|DIRECTORY",
		Short: "Import a cocoon snapshot, a checkpoint or a qcow2 cloud image under a CRI image reference",
		Long: "Import a cocoon snapshot archive (as cocoon snapshot export writes it), a cocoon-cri checkpoint\n" +
			"archive or a qcow2 cloud image, plain or gzip-compressed, into the cocoon-cri daemon on --socket,\n" +
			"and record it under REF. A DIRECTORY is a snapshot directory (cocoon snapshot export --to-dir)\n" +
			"or a pod checkpoint (or its container's entry), sent as the archive cocoon would export of it.\n" +
			"Pods then use REF as their image: a snapshot is cloned, a cloud image is booted.\n" +
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
	cmd.AddCommand(imp, newImagePushCommand(o))
	return cmd
}

func newImagePushCommand(o *options) *cobra.Command {
	var creds string
	push := &cobra.Command{
		Use:   "push [flags] ARCHIVE|DIRECTORY REF",
		Short: "Push a cocoon snapshot or a checkpoint, archive or directory, to a registry",
		Long: "Push a snapshot to the registry under REF (a tag) as a cocoon snapshot artifact (epoch's format),\n" +
			"which a pod with image REF on any node clones. ARCHIVE is what cocoon snapshot export writes,\n" +
			"plain or gzip-compressed, or a cocoon-cri checkpoint archive; DIRECTORY is what cocoon snapshot\n" +
			"export --to-dir writes, or a pod checkpoint (CheckpointPod's OUTPUT, or its container's entry\n" +
			"OUTPUT/<container ID>). A checkpoint's metadata goes into the manifest's\n" +
			"io.cocoonstack.cri.checkpoint annotation. Prints REF@DIGEST.\n" +
			"Registries are reached as the daemon pulls (--registry-insecure, --registry-ca-file).\n" +
			"Credentials come from --creds (or " + config.EnvName(envPrefix, "creds") + "), else from the docker\n" +
			"config (DOCKER_CONFIG or ~/.docker/config.json) for REF's registry.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return pushImage(ctx, cmd, o, creds, args[0], args[1])
		},
	}
	push.Flags().StringVar(&creds, "creds", "", "USER[:PASSWORD] for the registry; without a password it is asked for (or read from standard input)")
	o.addRegistryFlags(push.Flags())
	return push
}

func pushImage(ctx context.Context, cmd *cobra.Command, o *options, creds, snapshot, ref string) error {
	opts := imagestore.PushOptions{
		Insecure: o.registryInsecure,
		CAFile:   o.registryCAFile,
		Keychain: authn.DefaultKeychain,
		OnFile: func(name string, size int64) {
			fmt.Fprintf(cmd.ErrOrStderr(), "pushing %s (%s)\n", name, formatBytes(size))
		},
	}
	if creds != "" {
		user, password, err := parseCreds(cmd, creds)
		if err != nil {
			return err
		}
		opts.Credentials = imagestore.Credentials{Username: user, Password: password}
	}
	res, err := imagestore.Push(ctx, snapshot, ref, opts)
	if err != nil {
		return err
	}
	if md := res.Checkpoint; md != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "checkpoint of container %s of pod %s/%s, taken %s\n",
			md.Container.Name, md.Pod.Namespace, md.Pod.Name, md.CreatedAt.Format(time.RFC3339))
	}
	if len(res.Uncarried) > 0 {
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: the snapshot artifact has no field for snapshot.json's %s: "+
			"a pull of it has cocoon's defaults instead\n", strings.Join(res.Uncarried, ", "))
	}
	fmt.Fprintln(cmd.OutOrStdout(), res.DigestRef())
	return nil
}

// parseCreds reads USER[:PASSWORD]; a missing password is asked for on the terminal, or read as
// the first line of standard input when that is not a terminal.
func parseCreds(cmd *cobra.Command, creds string) (string, string, error) {
	user, password, hasPassword := strings.Cut(creds, ":")
	if user == "" {
		return "", "", fmt.Errorf("--creds %q: want USER[:PASSWORD]", creds)
	}
	if hasPassword {
		return user, password, nil
	}
	in := cmd.InOrStdin()
	if f, ok := in.(*os.File); ok && term.IsTerminal(int(f.Fd())) { //nolint:gosec // a file descriptor fits an int
		fmt.Fprintf(cmd.ErrOrStderr(), "password for %s: ", user)
		data, err := term.ReadPassword(int(f.Fd())) //nolint:gosec // as above
		fmt.Fprintln(cmd.ErrOrStderr())
		if err != nil {
			return "", "", fmt.Errorf("read the password: %w", err)
		}
		return user, string(data), nil
	}
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && (!errors.Is(err, io.EOF) || line == "") {
		return "", "", fmt.Errorf("--creds %s has no password, and none was on standard input: %w", user, err)
	}
	return user, strings.TrimRight(line, "\r\n"), nil
}

// formatBytes is n in binary units, for people.
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// importImage hashes the image, then streams it to the daemon, which checks the digest as cocoon
// reads it. A snapshot directory is sent as the archive cocoon would export of it, made once for
// the digest and once more for the daemon: a directory that changes in between is refused.
func importImage(cmd *cobra.Command, socket, ref, path string) error {
	path, err := imagestore.PodCheckpointEntry(path)
	if err != nil {
		return err
	}
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	write := func(w io.Writer) error { return imagestore.WriteSnapshotDir(w, path) }
	if !info.IsDir() {
		write = func(w io.Writer) error {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(w, f)
			return err
		}
	}
	h := sha256.New()
	if err := write(h); err != nil {
		return err
	}
	digest := "sha256:" + hex.EncodeToString(h.Sum(nil))
	conn, err := dialDaemon(socket)
	if err != nil {
		return err
	}
	defer conn.Close()
	pr, pw := io.Pipe()
	defer pr.Close() // ends the writer when the daemon stops reading early
	go func() { pw.CloseWithError(write(pw)) }()
	id, err := vmruntime.ImportImage(cmd.Context(), conn, ref, digest, pr)
	if err != nil {
		return fmt.Errorf("import %s: %w", path, err)
	}
	fmt.Fprintln(cmd.OutOrStdout(), id)
	return nil
}

// dialDaemon connects to the daemon's CRI socket, where its admin services are served too.
func dialDaemon(socket string) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", socket, err)
	}
	return conn, nil
}
