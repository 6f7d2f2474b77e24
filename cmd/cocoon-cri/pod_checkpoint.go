package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/cri/vmruntime"
	"github.com/cocoonstack/cocoon-cri/pkg/checkpoint"
)

// The pod-level checkpoint and restore of KEP-5823 from the command line: the kubelet has the RPCs
// in its CRI client but does not call them yet, and crictl has neither, so without these a pod
// checkpoint needs a Go CRI client (docs/checkpoint.md).

// podCallTimeout bounds a checkpoint or a restore: a checkpoint's own default is 5 minutes.
const podCallTimeout = 10 * time.Minute

func newPodCheckpointCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "checkpoint POD DIR",
		Short: "Checkpoint a running VM pod into a directory (CheckpointPod)",
		Long: "Checkpoint a running VM pod into DIR through the daemon on --socket: CheckpointPod with every\n" +
			"running container of the pod, which writes pod.json and each container's checkpoint there.\n" +
			"POD is NAMESPACE/NAME of a ready pod, or its sandbox ID (or a unique prefix of it). DIR is\n" +
			"made (mode 0700) when it does not exist, and must be empty. `cocoon-cri pod restore DIR`\n" +
			"makes a new pod of it; `cocoon-cri image push DIR REF` moves it through a registry.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), podCallTimeout)
			defer cancel()
			dir, err := filepath.Abs(args[1])
			if err != nil {
				return err
			}
			rt, closeConn, err := dialRuntime(o)
			if err != nil {
				return err
			}
			defer closeConn()
			sb, err := findPodSandbox(ctx, rt, args[0])
			if err != nil {
				return err
			}
			running, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
				PodSandboxId: sb.GetId(), State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
			}})
			if err != nil {
				return err
			}
			var ids []string
			for _, c := range running.GetContainers() {
				ids = append(ids, c.GetId())
			}
			if len(ids) == 0 {
				return fmt.Errorf("pod %s/%s (%s) has no running container to checkpoint", sb.GetMetadata().GetNamespace(), sb.GetMetadata().GetName(), sb.GetId())
			}
			if err := os.Mkdir(dir, 0o700); err != nil && !os.IsExist(err) {
				return err
			}
			if _, err := rt.CheckpointPod(ctx, &runtimeapi.CheckpointPodRequest{PodSandboxId: sb.GetId(), OutputPath: dir, ContainerIds: ids}); err != nil {
				return fmt.Errorf("checkpoint pod %s: %w", sb.GetId(), err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), dir)
			return nil
		},
	}
}

// dialRuntime is a client of the daemon's CRI runtime service on --socket.
func dialRuntime(o *options) (runtimeapi.RuntimeServiceClient, func() error, error) {
	conn, err := dialDaemon(o.socket)
	if err != nil {
		return nil, nil, err
	}
	return runtimeapi.NewRuntimeServiceClient(conn), conn.Close, nil
}

// findPodSandbox finds the pod a user names: NAMESPACE/NAME of a ready pod, its sandbox ID, or a
// unique prefix of that ID, as crictl takes one.
func findPodSandbox(ctx context.Context, rt runtimeapi.RuntimeServiceClient, pod string) (*runtimeapi.PodSandbox, error) {
	list, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, err
	}
	namespace, name, byName := strings.Cut(pod, "/")
	var found []*runtimeapi.PodSandbox
	for _, sb := range list.GetItems() {
		md := sb.GetMetadata()
		if byName && md.GetNamespace() == namespace && md.GetName() == name && sb.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY ||
			!byName && strings.HasPrefix(sb.GetId(), pod) {
			found = append(found, sb)
		}
	}
	switch {
	case pod == "":
		return nil, fmt.Errorf("name the pod: NAMESPACE/NAME, or its sandbox ID")
	case len(found) == 0:
		return nil, fmt.Errorf("no pod %s on this node", pod)
	case len(found) > 1:
		return nil, fmt.Errorf("%d pods match %s: give more of the sandbox ID", len(found), pod)
	}
	return found[0], nil
}

func newPodRestoreCommand(o *options) *cobra.Command {
	var containerFiles []string
	var start bool
	var handler string
	restore := &cobra.Command{
		Use:   "restore DIR POD_CONFIG",
		Short: "Restore a pod checkpoint as a new pod (RestorePod)",
		Long: "Make a new pod of the pod checkpoint in DIR through the daemon on --socket: RestorePod, with\n" +
			"POD_CONFIG, a pod sandbox config in JSON as crictl runp takes it (its own name and uid). Each of\n" +
			"the checkpoint's containers is configured by --container NAME=FILE (a container config in JSON\n" +
			"as crictl create takes it), or else by its name alone, its log in NAME/0.log of the pod's\n" +
			"log_directory. The JSON is the CRI messages': snake or camel case names, an env's value (bytes\n" +
			"in the CRI) in base64. The containers are CREATED; --start starts them, which resumes the\n" +
			"checkpointed machines. Prints the pod sandbox's ID, then each container's as NAME ID.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), podCallTimeout)
			defer cancel()
			dir, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			req := &runtimeapi.RestorePodRequest{CheckpointPath: dir, Config: &runtimeapi.PodSandboxConfig{}}
			if err := readCRIConfig(args[1], req.Config); err != nil {
				return err
			}
			if req.ContainerConfigs, err = restoreContainerConfigs(dir, containerFiles); err != nil {
				return err
			}
			req.RuntimeHandler = handler
			rt, closeConn, err := dialRuntime(o)
			if err != nil {
				return err
			}
			defer closeConn()
			resp, err := rt.RestorePod(ctx, req)
			if err != nil {
				return fmt.Errorf("restore %s: %w", dir, err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), resp.GetPodSandboxId())
			for _, c := range resp.GetRestoredContainers() {
				if start {
					if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: c.GetContainerId()}); err != nil {
						return fmt.Errorf("start restored container %s (%s): %w", c.GetName(), c.GetContainerId(), err)
					}
				}
				fmt.Fprintln(cmd.OutOrStdout(), c.GetName(), c.GetContainerId())
			}
			return nil
		},
	}
	restore.Flags().StringArrayVar(&containerFiles, "container", nil, "NAME=FILE: the config, in JSON, of the checkpoint's container NAME (repeat for each)")
	restore.Flags().BoolVar(&start, "start", false, "start the restored containers")
	restore.Flags().StringVar(&handler, "runtime", vmruntime.HandlerName, "runtime handler of the new pod, as crictl runp --runtime")
	return restore
}

// restoreContainerConfigs configures each container of the checkpoint in dir: from the file given
// for its name, else by its name alone, its log where the kubelet would put it (<name>/0.log in
// the pod's log directory). A file for a container the checkpoint lacks is refused.
func restoreContainerConfigs(dir string, files []string) ([]*runtimeapi.ContainerConfig, error) {
	pc, err := checkpoint.ReadPod(dir)
	if err != nil {
		return nil, err
	}
	given := map[string]string{}
	for _, f := range files {
		name, file, ok := strings.Cut(f, "=")
		if !ok || name == "" || file == "" {
			return nil, fmt.Errorf("--container %q: want NAME=FILE", f)
		}
		if !slices.ContainsFunc(pc.Containers, func(m checkpoint.PodMember) bool { return m.Name == name }) {
			return nil, fmt.Errorf("--container %s: the checkpoint in %s has no container %q", f, dir, name)
		}
		given[name] = file
	}
	var configs []*runtimeapi.ContainerConfig
	for _, m := range pc.Containers {
		cfg := &runtimeapi.ContainerConfig{}
		if file, ok := given[m.Name]; ok {
			if err := readCRIConfig(file, cfg); err != nil {
				return nil, err
			}
			if got := cfg.GetMetadata().GetName(); got != m.Name {
				return nil, fmt.Errorf("%s configures container %q, not %q", file, got, m.Name)
			}
		} else {
			cfg.Metadata = &runtimeapi.ContainerMetadata{Name: m.Name}
			// Where the kubelet puts a container's log in its pod's log directory.
			if filepath.IsLocal(m.Name) && filepath.Base(m.Name) == m.Name {
				cfg.LogPath = filepath.Join(m.Name, "0.log")
			}
		}
		configs = append(configs, cfg)
	}
	return configs, nil
}

// readCRIConfig reads a CRI config in the JSON of its protobuf message (field names in snake or
// lower camel case, enums by name or number, bytes in base64); a key it does not know is an
// error, not silently dropped.
func readCRIConfig(path string, into proto.Message) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := protojson.Unmarshal(data, into); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
