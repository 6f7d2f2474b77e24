package vmruntime

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/guestvolume"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/pkg/syncio"
	"github.com/cocoonstack/cocoon-cri/streaming"
)

// A guest sees none of the node's files: the kubelet's volumes (CRI mounts) are copied in through
// the guest exec path, under the guest's /run (a tmpfs, so a Secret stays in memory), and bound at
// their container paths. Read-only directories, which is what ConfigMap, Secret, projected and
// downward API volumes are, are kept in step with the host; a writable volume or a single file is
// copied when the container starts and is the guest's own afterwards. docs/design.md, Volumes.

// guestVolumesDir is where the copies live in the guest.
const guestVolumesDir = "/run/cocoon-cri/volumes"

// maxVolumeEntries bounds the files of one container's volumes, as VolumeMaxBytes their bytes.
const maxVolumeEntries = 10000

// volumeCopier copies a container's volumes into its guest through the guest exec path, and keeps
// the read-only directories among them in step with the host.
type volumeCopier struct {
	maxBytes     int64         // the bound of one container's volumes
	syncInterval time.Duration // how often read-only directories are brought in step
	log          *slog.Logger
	store        *store.Store
	guest        *guestExecutor
}

// validateMounts refuses what no copy can honour, before anything is made.
func validateMounts(mounts []*runtimeapi.Mount) error {
	seen := map[string]bool{}
	for _, m := range mounts {
		target, source := m.GetContainerPath(), m.GetHostPath()
		switch {
		case !path.IsAbs(target) || strings.IndexByte(target, 0) >= 0 || path.Clean(target) == "/":
			return invalid("mounts: container_path %q must be an absolute path in the guest other than /", target)
		case !filepath.IsAbs(source) || strings.IndexByte(source, 0) >= 0:
			return invalid("mounts: host_path %q of %s must be an absolute path on the node", source, target)
		case seen[path.Clean(target)]:
			return invalid("mounts: %s is mounted twice", target)
		case m.GetImage().GetImage() != "":
			return invalid("mounts: %s is an image volume, which cocoon-cri cannot give a VM guest; "+
				"use another runtime class, or put the files in the VM image", target)
		case m.GetPropagation() == runtimeapi.MountPropagation_PROPAGATION_BIDIRECTIONAL:
			return invalid("mounts: %s asks for bidirectional propagation: a guest's mounts cannot reach the node; "+
				"use another runtime class for a pod that mounts for the node", target)
		case len(m.GetUidMappings()) > 0 || len(m.GetGidMappings()) > 0:
			return invalid("mounts: %s has ID mappings, which belong to user namespaces that a VM sandbox does not use", target)
		case m.GetRecursiveReadOnly():
			return invalid("mounts: %s asks for a recursive read-only mount, which this runtime handler does not offer", target)
		}
		seen[path.Clean(target)] = true
	}
	return nil
}

// checkCanReach refuses a container whose volumes cannot be copied into its guest: no way
// to run commands there or a Windows guest (the copy is a POSIX shell's), a host path that is
// neither a directory nor a file, or more than the bound. Only the files the kubelet gives every
// container are left out then, and said so: refusing them would refuse every pod. A missing host
// path is made a directory first, as containerd does.
func (vs *volumeCopier) checkCanReach(ctx context.Context, cfg *runtimeapi.ContainerConfig, vm store.VM) error {
	mounts := cfg.GetMounts()
	if len(mounts) == 0 {
		return nil
	}
	execPath, err := vs.guest.path(ctx)
	if err != nil {
		return err
	}
	budget := vs.limits()
	for _, m := range mounts {
		switch {
		case (execPath == ExecPathNone || vm.Windows) && kubeletFileMount(cfg, m):
			continue
		case execPath == ExecPathNone:
			return invalid("mounts: %s cannot reach the guest: volumes are copied in through cocoon's vm exec or SSH, and neither is available "+
				"(this cocoon has no vm exec and no --guest-ssh-key-file is set); upgrade cocoon, configure SSH, or drop the volume",
				m.GetContainerPath())
		case vm.Windows:
			return invalid("mounts: %s cannot reach a Windows guest: cocoon-cri copies volumes in with a POSIX shell; drop the volume",
				m.GetContainerPath())
		}
		source, err := volumeSource(m.GetHostPath(), true)
		if err != nil {
			return invalid("mounts: %s: %v", m.GetContainerPath(), err)
		}
		tree, err := guestvolume.Scan(source, budget)
		var tooLarge *guestvolume.TooLargeError
		if errors.As(err, &tooLarge) {
			return invalid("mounts: %s: the container's volumes together hold more than %d bytes or %d files (reached at %s): "+
				"they are copied into the guest's memory; raise --volume-max-bytes or make the volume smaller",
				m.GetContainerPath(), vs.maxBytes, maxVolumeEntries, m.GetHostPath())
		}
		if err != nil {
			return invalid("mounts: %s: %v", m.GetContainerPath(), err)
		}
		budget.MaxBytes -= tree.Bytes
		budget.MaxEntries -= len(tree.Entries)
	}
	return nil
}

// kubeletFileMount reports whether m is one of the files the kubelet gives every container: the
// pod's /etc/hosts (its etc-hosts file) and the termination log (containers/<name>/<id> in the
// pod's directory).
func kubeletFileMount(cfg *runtimeapi.ContainerConfig, m *runtimeapi.Mount) bool {
	source := filepath.Clean(m.GetHostPath())
	if path.Clean(m.GetContainerPath()) == "/etc/hosts" && filepath.Base(source) == "etc-hosts" {
		return true
	}
	dir := filepath.Dir(source)
	return filepath.Base(dir) == cfg.GetMetadata().GetName() && filepath.Base(filepath.Dir(dir)) == "containers"
}

// guestTakesCopies reports whether volumes can be copied into the container's guest: a guest
// that takes commands and has a POSIX shell. A cocoon that cannot be asked now counts as able:
// the copy then fails, and says why.
func (vs *volumeCopier) guestTakesCopies(ctx context.Context, c *store.Container) bool {
	execPath, _, err := vs.guest.vmPath(ctx, c)
	return !c.VM.Windows && (err != nil || execPath != ExecPathNone)
}

func (vs *volumeCopier) limits() guestvolume.Limits {
	return guestvolume.Limits{MaxBytes: vs.maxBytes, MaxEntries: maxVolumeEntries}
}

// volumeSource is the host path with its links resolved (critest mounts a link to a directory);
// with create, a missing one is made a directory.
func volumeSource(hostPath string, create bool) (string, error) {
	source, err := filepath.EvalSymlinks(hostPath)
	if create && errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(hostPath, 0o755); err != nil {
			return "", fmt.Errorf("host path %s does not exist and cannot be made: %w", hostPath, err)
		}
		source, err = filepath.EvalSymlinks(hostPath)
	}
	if err != nil {
		return "", fmt.Errorf("host path %s: %w", hostPath, err)
	}
	return source, nil
}

// volumeCopy is one mount's copy in a guest, and what the guest was last given.
type volumeCopy struct {
	mount *runtimeapi.Mount
	guest guestvolume.Volume
	last  *guestvolume.Tree // nil: unknown, the next update is a full one
	// lastErr is the last failure logged, so a failure that repeats is logged once.
	lastErr string
}

// containerVolumes is a container's mounts as copies, parents before what is mounted inside them.
// Into a guest that takes no copies, the kubelet's own files are left out (CreateContainer
// refused anything else).
func containerVolumes(cfg *runtimeapi.ContainerConfig, takesCopies bool) []*volumeCopy {
	mounts := slices.DeleteFunc(slices.Clone(cfg.GetMounts()), func(m *runtimeapi.Mount) bool {
		return !takesCopies && kubeletFileMount(cfg, m)
	})
	slices.SortStableFunc(mounts, func(a, b *runtimeapi.Mount) int {
		return cmp.Compare(path.Clean(a.GetContainerPath()), path.Clean(b.GetContainerPath()))
	})
	copies := make([]*volumeCopy, len(mounts))
	for i, m := range mounts {
		copies[i] = &volumeCopy{mount: m, guest: guestvolume.Volume{
			DataDir:  fmt.Sprintf("%s/%d", guestVolumesDir, i),
			Target:   path.Clean(m.GetContainerPath()),
			ReadOnly: m.GetReadonly(),
			Once:     !m.GetReadonly(),
		}}
	}
	return copies
}

// deliver copies every volume into the guest and binds it at its container path.
func (vs *volumeCopier) deliver(ctx context.Context, sb *store.Sandbox, c *store.Container, copies []*volumeCopy) error {
	for _, vc := range copies {
		if err := vs.sync(ctx, sb, c, vc); err != nil {
			return fmt.Errorf("volume %s (from %s) did not reach the guest: %w", vc.mount.GetContainerPath(), vc.mount.GetHostPath(), err)
		}
	}
	return nil
}

// keepInStep brings the host's changes to read-only directory volumes into the guest until
// ctx ends (the container stops, or cocoon-cri does).
func (vs *volumeCopier) keepInStep(ctx context.Context, sb *store.Sandbox, c *store.Container, copies []*volumeCopy, log *slog.Logger) {
	var synced []*volumeCopy
	for _, vc := range copies {
		if !vc.guest.Once {
			synced = append(synced, vc)
		}
	}
	if len(synced) == 0 {
		return
	}
	tick := time.NewTicker(vs.syncInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		// A hibernated guest takes the change once it wakes: the sync is not a use of the pod.
		if cur, err := vs.store.Containers.Get(c.ID); err == nil && cur.VM.Hibernation.Snapshot != "" {
			continue
		}
		for _, vc := range synced {
			err := vs.sync(ctx, sb, c, vc)
			switch {
			case ctx.Err() != nil:
				return
			case err != nil && err.Error() != vc.lastErr:
				log.Warn("a volume's change did not reach the guest; trying again", "volume", vc.mount.GetContainerPath(), "err", err)
				vc.lastErr = err.Error()
			case err == nil && vc.lastErr != "":
				log.Info("the volume is in step with the host again", "volume", vc.mount.GetContainerPath())
				vc.lastErr = ""
			}
		}
	}
}

// sync brings one copy in step with the host. A guest that lost its copy (it rebooted) gets
// a full one; a volume that changed while it was read is read again.
func (vs *volumeCopier) sync(ctx context.Context, sb *store.Sandbox, c *store.Container, vc *volumeCopy) error {
	source, err := volumeSource(vc.mount.GetHostPath(), false)
	if err != nil {
		return err
	}
	next, err := guestvolume.Scan(source, vs.limits())
	if err != nil {
		return err
	}
	for range 3 {
		u := guestvolume.Diff(vc.last, next)
		if u.Empty() {
			return nil
		}
		code, out, err := vs.runUpdate(ctx, sb, c, u, vc.guest, source, next)
		switch {
		case err != nil:
			return err
		case code == guestvolume.ExitLost && !u.Full:
			vc.last = nil
			continue
		case code == guestvolume.ExitIncomplete:
			// The volume changed while it was read (the kubelet swapped a ConfigMap's data): the
			// guest kept its copy as it was; read the volume again.
			if next, err = guestvolume.Scan(source, vs.limits()); err != nil {
				return err
			}
			continue
		case code != 0:
			return fmt.Errorf("the guest's copy command exited with %d: %s", code, strings.TrimSpace(out))
		}
		if len(next.Skipped) > 0 {
			vs.log.Warn("volume entries left out of the guest: only directories, files and links can be copied",
				"container", c.ID, "volume", vc.mount.GetContainerPath(), "skipped", next.Skipped)
		}
		vc.last = &next
		return nil
	}
	return errors.New("the guest lost its copy, or the volume changed while it was read, three times in a row")
}

// runUpdate runs the update's script in the guest with its tar stream on stdin.
func (vs *volumeCopier) runUpdate(ctx context.Context, sb *store.Sandbox, c *store.Container, u guestvolume.Update,
	v guestvolume.Volume, source string, tree guestvolume.Tree) (int, string, error) {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(u.WriteTar(pw, source, tree)) }()
	defer pr.Close() //nolint:errcheck // lets the writer go when the guest stops reading
	out := &syncio.Tail{Max: guestOutputTail}
	code, err := vs.guest.run(ctx, sb, c, systemCommand("/bin/sh", "-c", u.Script(v, tree.File)),
		streaming.ExecIO{Stdin: pr, Stdout: out, Stderr: out})
	return code, out.String(), err
}
