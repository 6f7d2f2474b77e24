package cocoonsim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

// snapshotCommand builds "cocoon snapshot" (cmd/snapshot/commands.go).
func (a *app) snapshotCommand() *cobra.Command {
	snapshotCmd := &cobra.Command{Use: "snapshot", Short: "Manage VM snapshots"}

	saveCmd := &cobra.Command{Use: "save [flags] VM", Short: "Create a snapshot from a running VM", Args: cobra.ExactArgs(1), RunE: a.snapshotSave}
	saveCmd.Flags().String("name", "", "snapshot name")
	saveCmd.Flags().String("description", "", "snapshot description")

	listCmd := &cobra.Command{Use: "list", Aliases: []string{"ls"}, Short: "List all snapshots", RunE: a.snapshotList}
	addFormatFlag(listCmd)
	listCmd.Flags().String("vm", "", "only show snapshots belonging to this VM")

	inspectCmd := &cobra.Command{Use: "inspect SNAPSHOT", Short: "Show detailed snapshot info (JSON)", Args: cobra.ExactArgs(1), RunE: a.snapshotInspect}
	rmCmd := &cobra.Command{Use: "rm SNAPSHOT [SNAPSHOT...]", Short: "Delete snapshot(s)", Args: cobra.MinimumNArgs(1), RunE: a.snapshotRM}

	exportCmd := &cobra.Command{Use: "export SNAPSHOT", Short: "Export a snapshot to a portable archive file", Args: cobra.ExactArgs(1), RunE: a.snapshotExport}
	exportCmd.Flags().StringP("output", "o", "", "output file path (default: <name-or-id>.tar)")
	exportCmd.Flags().Bool("gzip", false, "compress output with gzip")
	if a.profile.SnapshotDirs {
		exportCmd.Flags().String("to-dir", "", "export into a directory (must be empty/absent) instead of a tar; pairs with 'vm clone --from-dir'")
		exportCmd.MarkFlagsMutuallyExclusive("to-dir", "output")
		exportCmd.MarkFlagsMutuallyExclusive("to-dir", "gzip")
	}

	importCmd := &cobra.Command{Use: "import [FILE]", Short: "Import a snapshot from a portable archive (file or stdin)", Args: cobra.MaximumNArgs(1), RunE: a.snapshotImport}
	importCmd.Flags().String("name", "", "override snapshot name")
	importCmd.Flags().String("description", "", "override snapshot description")

	snapshotCmd.AddCommand(saveCmd, listCmd, inspectCmd, rmCmd, exportCmd, importCmd)
	return snapshotCmd
}

// vmOwnerAndSnapshots finds the backend that holds a VM and opens the snapshot store: where
// snapshot save, vm hibernate and vm restore begin.
func (a *app) vmOwnerAndSnapshots(ctx context.Context, vmRef string) (*backend, *snapshotStore, error) {
	backends, err := allBackends(a.conf, a.log)
	if err != nil {
		return nil, nil, err
	}
	owner, err := resolveVMOwner(ctx, backends, vmRef)
	if err != nil {
		return nil, nil, fmt.Errorf("find VM %s: %w", vmRef, err)
	}
	store, err := newSnapshotStore(a.conf)
	if err != nil {
		return nil, nil, err
	}
	return owner, store, nil
}

// checkNameFree fails when a snapshot already has the name ("" is free: cocoon names it by ID).
func (s *snapshotStore) checkNameFree(ctx context.Context, name string) error {
	if name == "" {
		return nil
	}
	if _, err := s.inspect(ctx, name); err == nil {
		return fmt.Errorf("snapshot name %q already exists", name)
	} else if !errors.Is(err, errSnapshotNotFound) {
		return fmt.Errorf("check snapshot name: %w", err)
	}
	return nil
}

// snapshotSave snapshots a running VM. Like cocoon it prints no JSON: the ID is only in the log
// line "snapshot saved: <ID>".
func (a *app) snapshotSave(cmd *cobra.Command, args []string) error {
	logger := a.log.with("cmd.snapshot.save")
	ctx := cmd.Context()
	vmRef := args[0]
	owner, store, err := a.vmOwnerAndSnapshots(ctx, vmRef)
	if err != nil {
		return err
	}
	name, _ := cmd.Flags().GetString("name")
	description, _ := cmd.Flags().GetString("description")
	if err := store.checkNameFree(ctx, name); err != nil {
		return err
	}
	logger.Infof("snapshotting VM %s ...", vmRef)
	cfg, tmpDir, err := owner.snapshot(ctx, vmRef)
	if err != nil {
		return fmt.Errorf("snapshot VM %s: %w", vmRef, err)
	}
	defer os.RemoveAll(tmpDir) //nolint:errcheck
	cfg.Name, cfg.Description = name, description
	logger.Infof("saving snapshot data ...")
	id, err := store.create(ctx, cfg, tmpDir)
	if err != nil {
		return fmt.Errorf("save snapshot: %w", err)
	}
	logger.Infof("snapshot saved: %s", id)
	return nil
}

func (a *app) snapshotList(cmd *cobra.Command, _ []string) error {
	ctx := cmd.Context()
	store, err := newSnapshotStore(a.conf)
	if err != nil {
		return err
	}
	var filter map[string]struct{}
	if vmRef, _ := cmd.Flags().GetString("vm"); vmRef != "" {
		backends, err := allBackends(a.conf, a.log)
		if err != nil {
			return err
		}
		owner, err := resolveVMOwner(ctx, backends, vmRef)
		if err != nil {
			return err
		}
		vm, err := owner.inspect(ctx, vmRef)
		if err != nil {
			return fmt.Errorf("inspect VM %s: %w", vmRef, err)
		}
		if len(vm.SnapshotIDs) == 0 {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), "No snapshots found for VM.")
			return err
		}
		filter = vm.SnapshotIDs
	}
	snaps, err := store.list(ctx)
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	if filter != nil {
		snaps = slices.DeleteFunc(snaps, func(s *cocoon.Snapshot) bool { _, ok := filter[s.ID]; return !ok })
	}
	if len(snaps) == 0 {
		_, err := fmt.Fprintln(cmd.OutOrStdout(), "No snapshots found.")
		return err
	}
	slices.SortStableFunc(snaps, func(x, y *cocoon.Snapshot) int { return x.CreatedAt.Compare(y.CreatedAt) })
	return outputFormatted(cmd, snaps, func(w io.Writer) {
		fmt.Fprintln(w, "ID\tNAME\tCPU\tMEMORY\tDESCRIPTION\tCREATED") //nolint:errcheck
		for _, s := range snaps {
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\n", s.ID, s.Name, s.CPU, humanSize(s.Memory), s.Description, s.CreatedAt.Local().Format(time.DateTime)) //nolint:errcheck
		}
	})
}

func (a *app) snapshotInspect(cmd *cobra.Command, args []string) error {
	store, err := newSnapshotStore(a.conf)
	if err != nil {
		return err
	}
	snap, err := store.inspect(cmd.Context(), args[0])
	if err != nil {
		return fmt.Errorf("inspect: %w", err)
	}
	return outputJSON(cmd.OutOrStdout(), snap)
}

func (a *app) snapshotRM(cmd *cobra.Command, args []string) error {
	logger := a.log.with("cmd.snapshot.rm")
	store, err := newSnapshotStore(a.conf)
	if err != nil {
		return err
	}
	deleted, err := store.delete(cmd.Context(), args)
	for _, id := range deleted {
		logger.Infof("deleted: %s", id)
	}
	if err != nil {
		return fmt.Errorf("rm: %w", err)
	}
	if len(deleted) == 0 {
		logger.Infof("no snapshots deleted")
	}
	return nil
}

// snapshotExport writes the archive to -o FILE, to stdout for "-o -", or to <name-or-id>.tar in
// the working directory.
func (a *app) snapshotExport(cmd *cobra.Command, args []string) (err error) {
	logger := a.log.with("cmd.snapshot.export")
	store, err := newSnapshotStore(a.conf)
	if err != nil {
		return err
	}
	ref := args[0]
	output, _ := cmd.Flags().GetString("output")
	compress, _ := cmd.Flags().GetBool("gzip")
	if toDir, _ := cmd.Flags().GetString("to-dir"); toDir != "" {
		logger.Infof("exporting to dir %s ...", toDir)
		if err := store.exportToDir(cmd.Context(), ref, toDir); err != nil {
			return fmt.Errorf("export-to-dir: %w", err)
		}
		logger.Infof("exported: %s", toDir)
		return nil
	}
	dataDir, cfg, err := store.dataDir(cmd.Context(), ref)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if output == "-" {
		if err := writeArchive(cmd.OutOrStdout(), dataDir, cfg, compress); err != nil {
			return fmt.Errorf("write archive: %w", err)
		}
		return nil
	}
	if output == "" {
		output = cfg.Name
		if output == "" {
			output = cfg.ID
		}
		output += map[bool]string{false: ".tar", true: ".tar.gz"}[compress]
	}
	f, err := os.Create(output) //nolint:gosec // operator-chosen output path
	if err != nil {
		return fmt.Errorf("create output file: %w", err)
	}
	defer func() {
		_ = f.Close()
		if err != nil {
			_ = os.Remove(output)
		}
	}()
	logger.Infof("exporting to %s ...", output)
	if err := writeArchive(f, dataDir, cfg, compress); err != nil {
		return fmt.Errorf("write archive: %w", err)
	}
	logger.Infof("exported: %s", output)
	return nil
}

// snapshotImport prints no JSON either: the new ID is in the log line "snapshot imported: <ID>".
func (a *app) snapshotImport(cmd *cobra.Command, args []string) error {
	logger := a.log.with("cmd.snapshot.import")
	store, err := newSnapshotStore(a.conf)
	if err != nil {
		return err
	}
	name, _ := cmd.Flags().GetString("name")
	description, _ := cmd.Flags().GetString("description")
	r := cmd.InOrStdin()
	if len(args) > 0 {
		f, err := os.Open(args[0])
		if err != nil {
			return fmt.Errorf("open archive: %w", err)
		}
		defer f.Close() //nolint:errcheck
		r = f
		logger.Infof("importing from %s ...", args[0])
	} else {
		logger.Infof("importing from stdin ...")
	}
	id, err := store.importArchive(cmd.Context(), r, name, description)
	if err != nil {
		return fmt.Errorf("import: %w", err)
	}
	logger.Infof("snapshot imported: %s", id)
	return nil
}
