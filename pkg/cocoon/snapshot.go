package cocoon

import (
	"context"
	"io"
	"time"
)

// transferTimeout bounds imports and pulls, whose real limit is the caller's context: multi-GiB
// archives take minutes.
const transferTimeout = 6 * time.Hour

// SnapshotImport imports a snapshot archive (tar, gzip detected by cocoon) from r under name and
// returns the imported snapshot. cocoon prints no JSON for an import, so it is looked up by name.
func (c *Client) SnapshotImport(ctx context.Context, r io.Reader, name, description string) (*Snapshot, error) {
	args := []string{"snapshot", "import", "--name", name}
	args = appendIf(args, description != "", "--description", description)
	if _, err := c.run(ctx, call{args: args, stdin: r, timeout: transferTimeout, long: true}); err != nil {
		return nil, err
	}
	return c.SnapshotInspect(ctx, name)
}

// SnapshotSave snapshots a running VM, memory and disk, under name. cocoon pauses the VM for the
// capture and resumes it before it returns, on failure too. It prints no JSON (the ID is only in a
// log line), so the snapshot is looked up by name.
func (c *Client) SnapshotSave(ctx context.Context, vm, name, description string) (*Snapshot, error) {
	args := []string{"snapshot", "save", "--name", name}
	args = appendIf(args, description != "", "--description", description)
	if _, err := c.run(ctx, call{args: append(args, vm), timeout: transferTimeout, long: true}); err != nil {
		return nil, err
	}
	return c.SnapshotInspect(ctx, name)
}

// SnapshotExport writes a snapshot's archive (uncompressed tar, snapshot.json first) to w as cocoon
// produces it.
func (c *Client) SnapshotExport(ctx context.Context, ref string, w io.Writer) error {
	_, err := c.run(ctx, call{args: []string{"snapshot", "export", "-o", "-", ref}, stdout: w, timeout: transferTimeout, long: true})
	return err
}

// SnapshotExportToDir writes a snapshot's files into dir, which cocoon creates and which must be
// empty: the data files reflinked or copied from cocoon's store, then snapshot.json, written last,
// so that its presence says the rest is whole. A failure may leave what was copied (some releases
// remove it, some do not): the caller removes dir. Where Capabilities.SnapshotDirs.
func (c *Client) SnapshotExportToDir(ctx context.Context, ref, dir string) error {
	_, err := c.run(ctx, call{args: []string{"snapshot", "export", "--to-dir", dir, ref}, timeout: transferTimeout, long: true})
	return err
}

// SnapshotInspect returns one snapshot by ID or name.
func (c *Client) SnapshotInspect(ctx context.Context, ref string) (*Snapshot, error) {
	return query[Snapshot](ctx, c, "snapshot", "inspect", ref)
}

// SnapshotList returns every snapshot.
func (c *Client) SnapshotList(ctx context.Context) ([]Snapshot, error) {
	return queryList[Snapshot](ctx, c, "snapshot", "list")
}

// SnapshotRemove deletes a snapshot. A missing one is ErrNotFound. cocoon does not check for
// on-demand clones that still read the snapshot's memory file: that is the caller's job.
func (c *Client) SnapshotRemove(ctx context.Context, ref string) error {
	_, err := c.run(ctx, call{args: []string{"snapshot", "rm", ref}})
	return err
}
