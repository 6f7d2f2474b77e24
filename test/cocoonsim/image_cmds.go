package cocoonsim

import (
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

// digestDisplayLen is how much of the digest the image table shows.
const digestDisplayLen = 19

// imageCommand builds "cocoon image" (cmd/images/commands.go).
func (a *app) imageCommand() *cobra.Command {
	imageCmd := &cobra.Command{Use: "image", Short: "Manage images"}
	listCmd := &cobra.Command{Use: "list", Aliases: []string{"ls"}, Short: "List locally stored images (all backends)", RunE: a.imageList}
	addFormatFlag(listCmd)
	importCmd := &cobra.Command{
		Use:   "import NAME [FILE...]",
		Short: "Import an image from a file or stdin",
		Args:  cobra.MinimumNArgs(1),
		RunE:  a.imageImport,
	}
	pullCmd := &cobra.Command{Use: "pull IMAGE [IMAGE...]", Short: "Pull OCI image(s) or cloud image URL(s)", Args: cobra.MinimumNArgs(1), RunE: a.imagePull}
	pullCmd.Flags().Bool("force", false, "bypass cache and always re-download (useful when a mutable tag was replaced upstream)")
	imageCmd.AddCommand(pullCmd, importCmd, listCmd,
		&cobra.Command{Use: "rm ID [ID...]", Short: "Delete locally stored image(s)", Args: cobra.MinimumNArgs(1), RunE: a.imageRM},
		&cobra.Command{Use: "inspect IMAGE", Short: "Show detailed image info (JSON)", Args: cobra.ExactArgs(1), RunE: a.imageInspect},
	)
	return imageCmd
}

func (a *app) imageBackendList() ([]imageBackend, error) {
	oci, cloudimg, err := a.imageBackends()
	if err != nil {
		return nil, err
	}
	return []imageBackend{oci, cloudimg}, nil
}

func (a *app) imageList(cmd *cobra.Command, _ []string) error {
	backends, err := a.imageBackendList()
	if err != nil {
		return err
	}
	var all []*cocoon.Image
	for _, b := range backends {
		imgs, err := b.list(cmd.Context())
		if err != nil {
			return fmt.Errorf("list %s: %w", b.typ(), err)
		}
		slices.SortFunc(imgs, func(x, y *cocoon.Image) int { return x.CreatedAt.Compare(y.CreatedAt) })
		all = append(all, imgs...)
	}
	if len(all) == 0 {
		_, err := fmt.Fprintln(cmd.OutOrStdout(), "No images found.")
		return err
	}
	return outputFormatted(cmd, all, func(w io.Writer) {
		fmt.Fprintln(w, "TYPE\tNAME\tDIGEST\tSIZE\tCREATED") //nolint:errcheck
		for _, img := range all {
			digest := img.ID
			if len(digest) > digestDisplayLen {
				digest = digest[:digestDisplayLen]
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", img.Type, img.Name, digest, humanSize(img.Size), img.CreatedAt.Local().Format(time.DateTime)) //nolint:errcheck
		}
	})
}

func (a *app) imageInspect(cmd *cobra.Command, args []string) error {
	backends, err := a.imageBackendList()
	if err != nil {
		return err
	}
	owner, err := resolveImageOwner(cmd.Context(), backends, args[0])
	if err != nil {
		return err
	}
	img, err := owner.inspect(cmd.Context(), args[0])
	if err != nil {
		return fmt.Errorf("inspect %s: %w", owner.typ(), err)
	}
	if img == nil {
		return fmt.Errorf("image %q: disappeared during resolve", args[0])
	}
	return outputJSON(cmd.OutOrStdout(), img)
}

func (a *app) imageRM(cmd *cobra.Command, args []string) error {
	logger := a.log.with("cmd.image.rm")
	backends, err := a.imageBackendList()
	if err != nil {
		return err
	}
	byOwner := map[imageBackend][]string{}
	var order []imageBackend
	for _, ref := range args {
		owner, err := resolveImageOwner(cmd.Context(), backends, ref)
		if err != nil {
			return err
		}
		if _, seen := byOwner[owner]; !seen {
			order = append(order, owner)
		}
		byOwner[owner] = append(byOwner[owner], ref)
	}
	var deleted []string
	for _, b := range order {
		refs, err := b.delete(cmd.Context(), byOwner[b])
		if err != nil {
			return fmt.Errorf("delete %s: %w", b.typ(), err)
		}
		deleted = append(deleted, refs...)
	}
	for _, ref := range deleted {
		logger.Infof("deleted: %s", ref)
	}
	if len(deleted) == 0 {
		logger.Infof("no matching images found")
	}
	return nil
}
