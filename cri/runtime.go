package cri

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/cocoonstack/cocoon-cri/cri/grpcerr"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/refresh"
)

// passthroughProbeTimeout bounds the passthrough runtime's part of Status and ImageFsInfo, the calls
// clients make to check the runtime, so that a passthrough runtime that hangs shows as not ready
// instead of holding up the kubelet's view of the VM runtime.
const passthroughProbeTimeout = 5 * time.Second

// Reasons of the runtime conditions the router adds, in the kubelet's CamelCase.
const (
	reasonPassthroughUnavailable = "PassthroughRuntimeUnavailable"
	reasonCgroupDriverMismatch   = "CgroupDriverMismatch"
)

// Version is the VM runtime's: cocoon-cri is the runtime the kubelet talks to.
func (r *Router) Version(ctx context.Context, req *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return r.toVM(ctx).Version(ctx, req)
}

// Status merges both runtimes' conditions: RuntimeReady and NetworkReady hold only when they hold
// for both, so the node is Ready only when both runtimes are. The handlers are both runtimes'.
func (r *Router) Status(ctx context.Context, req *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	if r.pass == nil {
		return r.toVM(ctx).Status(ctx, req)
	}
	serve(ctx, servedByBoth)
	var (
		wg      sync.WaitGroup
		pass    *runtimeapi.StatusResponse
		passErr error
	)
	wg.Go(func() {
		pctx, cancel := context.WithTimeout(ctx, passthroughProbeTimeout)
		defer cancel()
		pass, passErr = r.pass.Status(pctx, req)
	})
	vm, err := r.vm.Status(ctx, req)
	wg.Wait()
	if err != nil {
		return nil, err
	}
	resp := proto.CloneOf(vm)
	conds := resp.GetStatus().GetConditions()
	if passErr != nil {
		conds = notReady(conds, runtimeapi.RuntimeReady, reasonPassthroughUnavailable,
			fmt.Sprintf("passthrough runtime %s does not answer: %s", r.passName, status.Convert(passErr).Message()))
	} else {
		conds = r.mergeConditions(conds, pass.GetStatus().GetConditions())
		resp.RuntimeHandlers = r.mergeHandlers(pass.GetRuntimeHandlers(), resp.GetRuntimeHandlers())
		resp.Features = andFeatures(resp.GetFeatures(), pass.GetFeatures())
		for k, v := range pass.GetInfo() {
			if resp.Info == nil {
				resp.Info = map[string]string{}
			}
			resp.Info["passthrough."+k] = v
		}
	}
	if check := r.cgroups.v.Get(ctx); check.Err != nil && errors.As(check.Err, new(*cgroupDriverMismatch)) {
		conds = notReady(conds, runtimeapi.RuntimeReady, reasonCgroupDriverMismatch, check.Err.Error())
	}
	resp.Status = &runtimeapi.RuntimeStatus{Conditions: conds}
	return resp, nil
}

// mergeConditions folds the passthrough runtime's conditions into the VM runtime's. Condition
// types of its own (containerd has some) pass unchanged.
func (r *Router) mergeConditions(conds, pass []*runtimeapi.RuntimeCondition) []*runtimeapi.RuntimeCondition {
	for _, pc := range pass {
		if !slices.ContainsFunc(conds, func(c *runtimeapi.RuntimeCondition) bool { return c.GetType() == pc.GetType() }) {
			conds = append(conds, pc)
			continue
		}
		if !pc.GetStatus() {
			conds = notReady(conds, pc.GetType(), pc.GetReason(), fmt.Sprintf("passthrough runtime %s: %s", r.passName, pc.GetMessage()))
		}
	}
	return conds
}

// notReady turns condition typ false, keeping the first reason and every message.
func notReady(conds []*runtimeapi.RuntimeCondition, typ, reason, message string) []*runtimeapi.RuntimeCondition {
	for _, c := range conds {
		if c.GetType() != typ {
			continue
		}
		if c.GetStatus() {
			c.Status, c.Reason, c.Message = false, reason, message
		} else {
			c.Message += "; " + message
		}
		return conds
	}
	return append(conds, &runtimeapi.RuntimeCondition{Type: typ, Status: false, Reason: reason, Message: message})
}

// mergeHandlers lists the passthrough runtime's handlers, but for those the VM runtime serves,
// then the VM runtime's.
func (r *Router) mergeHandlers(pass, vm []*runtimeapi.RuntimeHandler) []*runtimeapi.RuntimeHandler {
	out := make([]*runtimeapi.RuntimeHandler, 0, len(pass)+len(vm))
	for _, h := range pass {
		if !r.vm.ServesHandler(h.GetName()) {
			out = append(out, h)
		}
	}
	return append(out, vm...)
}

// andFeatures: the node can promise a feature only when both runtimes have it.
func andFeatures(vm, pass *runtimeapi.RuntimeFeatures) *runtimeapi.RuntimeFeatures {
	return &runtimeapi.RuntimeFeatures{
		SupplementalGroupsPolicy:  vm.GetSupplementalGroupsPolicy() && pass.GetSupplementalGroupsPolicy(),
		UserNamespacesHostNetwork: vm.GetUserNamespacesHostNetwork() && pass.GetUserNamespacesHostNetwork(),
		MountOptions:              vm.GetMountOptions() && pass.GetMountOptions(),
	}
}

// RuntimeConfig answers with the passthrough runtime's configuration, whose cgroup driver the
// VM runtime's must equal (CheckCgroupDriver). A passthrough runtime too old to have the call
// leaves the answer to the VM runtime.
func (r *Router) RuntimeConfig(ctx context.Context, req *runtimeapi.RuntimeConfigRequest) (*runtimeapi.RuntimeConfigResponse, error) {
	if r.pass == nil {
		return r.toVM(ctx).RuntimeConfig(ctx, req)
	}
	resp, err := r.toPassthrough(ctx).RuntimeConfig(ctx, req)
	if grpcerr.Code(err) == codes.Unimplemented {
		return r.toVM(ctx).RuntimeConfig(ctx, req)
	}
	return resp, err
}

// UpdateRuntimeConfig goes to both runtimes.
func (r *Router) UpdateRuntimeConfig(ctx context.Context, req *runtimeapi.UpdateRuntimeConfigRequest) (*runtimeapi.UpdateRuntimeConfigResponse, error) {
	if r.pass == nil {
		return r.toVM(ctx).UpdateRuntimeConfig(ctx, req)
	}
	_, _, err := fromBoth(ctx, r, func(ctx context.Context, b Backend) (*runtimeapi.UpdateRuntimeConfigResponse, error) {
		return b.UpdateRuntimeConfig(ctx, req)
	})
	if err != nil {
		return nil, err
	}
	return &runtimeapi.UpdateRuntimeConfigResponse{}, nil
}

// CheckpointPod goes to the sandbox's owner.
func (r *Router) CheckpointPod(ctx context.Context, req *runtimeapi.CheckpointPodRequest) (*runtimeapi.CheckpointPodResponse, error) {
	b, err := r.sandboxOwner(ctx, req.GetPodSandboxId())
	if err != nil {
		return nil, err
	}
	return b.CheckpointPod(ctx, req)
}

// RestorePod goes by the runtime handler, as RunPodSandbox.
func (r *Router) RestorePod(ctx context.Context, req *runtimeapi.RestorePodRequest) (*runtimeapi.RestorePodResponse, error) {
	return r.handlerOwner(ctx, req.GetRuntimeHandler()).RestorePod(ctx, req)
}

// cgroupDriverMismatch: the kubelet takes its cgroup driver from RuntimeConfig, which is the
// passthrough runtime's, so a VM runtime with another driver would put VMs where the kubelet
// neither limits nor counts them.
type cgroupDriverMismatch struct {
	vm, pass runtimeapi.CgroupDriver
	passName string
}

func (e *cgroupDriverMismatch) Error() string {
	return fmt.Sprintf("cgroup drivers differ: cocoon-cri uses %s (--cgroup-driver) and the passthrough runtime %s uses %s; "+
		"set cocoon-cri's --cgroup-driver to %s, the driver the kubelet and the passthrough runtime share",
		driverName(e.vm), e.passName, driverName(e.pass), driverName(e.pass))
}

func driverName(d runtimeapi.CgroupDriver) string {
	if d == runtimeapi.CgroupDriver_CGROUPFS {
		return "cgroupfs"
	}
	return "systemd"
}

// cgroupCheckInterval is how soon a passthrough runtime restarted with another cgroup driver
// shows in Status.
const cgroupCheckInterval = 30 * time.Second

// cgroupCheck keeps the last comparison of the two runtimes' cgroup drivers.
type cgroupCheck struct {
	v *refresh.Value[struct{}]
}

func newCgroupCheck(vm VMBackend, pass Backend, passName string) *cgroupCheck {
	return &cgroupCheck{v: refresh.New(cgroupCheckInterval, passthroughProbeTimeout, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, compareCgroupDrivers(ctx, vm, pass, passName)
	})}
}

// errDriverUnknown: the passthrough runtime has no RuntimeConfig (containerd 1.6), so its driver
// cannot be compared and the kubelet's configuration decides.
var errDriverUnknown = errors.New("the passthrough runtime does not report its cgroup driver (no RuntimeConfig)")

func compareCgroupDrivers(ctx context.Context, vm VMBackend, pass Backend, passName string) error {
	resp, err := pass.RuntimeConfig(ctx, &runtimeapi.RuntimeConfigRequest{})
	if grpcerr.Code(err) == codes.Unimplemented {
		return errDriverUnknown
	}
	if err != nil {
		return fmt.Errorf("ask the passthrough runtime %s for its cgroup driver: %w", passName, err)
	}
	// An answer without the Linux part means systemd, the enum's zero value: containerd and
	// CRI-O always fill it in.
	passDriver := resp.GetLinux().GetCgroupDriver()
	if passDriver != vm.CgroupDriver() {
		return &cgroupDriverMismatch{vm: vm.CgroupDriver(), pass: passDriver, passName: passName}
	}
	return nil
}

// CheckCgroupDriver compares the two runtimes' cgroup drivers once, at start. A mismatch is an
// error the daemon refuses to start with; a passthrough runtime that cannot say is logged, and one
// that does not answer yet is checked again by Status once it does.
func (r *Router) CheckCgroupDriver(ctx context.Context) error {
	if r.pass == nil {
		return nil
	}
	err := compareCgroupDrivers(ctx, r.vm, r.pass, r.passName)
	var mismatch *cgroupDriverMismatch
	switch {
	case err == nil:
		r.log.Info("cgroup driver agreed with the passthrough runtime", "driver", driverName(r.vm.CgroupDriver()), "passthrough", r.passName)
	case errors.As(err, &mismatch):
		return err
	case errors.Is(err, errDriverUnknown):
		r.log.Warn("cannot compare cgroup drivers; make sure the kubelet's cgroupDriver is cocoon-cri's",
			"driver", driverName(r.vm.CgroupDriver()), "passthrough", r.passName, "err", err)
	default:
		r.log.Warn("the passthrough runtime does not answer yet; its cgroup driver is checked once it does", "passthrough", r.passName, "err", err)
	}
	return nil
}
