package vmruntime

import (
	"context"
	"fmt"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/refresh"
)

// Reasons of the runtime conditions, in the CamelCase the kubelet shows on the node.
const (
	reasonCocoonUnavailable = "CocoonUnavailable"
	reasonCocoonTooOld      = "CocoonTooOld"
	// reasonNetworkNotReady is the reason containerd and CRI-O give, which operators know.
	reasonNetworkNotReady = "NetworkPluginNotReady"
)

// networkProbeInterval bounds how long a new or fixed CNI configuration takes to show as ready.
const networkProbeInterval = 2 * time.Second

// Status reports RuntimeReady (cocoon answers, and is recent enough) and NetworkReady, and the
// handlers served.
func (s *Runtime) Status(ctx context.Context, req *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	probe := s.health.Get(ctx)
	runtimeReady := &runtimeapi.RuntimeCondition{Type: runtimeapi.RuntimeReady, Status: true}
	if probe.Err != nil {
		runtimeReady.Status = false
		runtimeReady.Reason = reasonCocoonUnavailable
		runtimeReady.Message = "cocoon does not answer: " + probe.Err.Error()
	} else if err := cocoon.CheckVersion(probe.Value.Version); err != nil {
		runtimeReady.Status = false
		runtimeReady.Reason = reasonCocoonTooOld
		runtimeReady.Message = err.Error()
	}
	netProbe := s.netReady.Get(ctx)
	networkReady := &runtimeapi.RuntimeCondition{Type: runtimeapi.NetworkReady, Status: netProbe.Err == nil}
	if netProbe.Err != nil {
		networkReady.Reason = reasonNetworkNotReady
		networkReady.Message = "pod network is not ready: " + netProbe.Err.Error()
	}

	handlers := []*runtimeapi.RuntimeHandler{{Name: HandlerName, Features: handlerFeatures()}}
	if s.cfg.ServeDefaultHandler {
		handlers = append([]*runtimeapi.RuntimeHandler{{Name: "", Features: handlerFeatures()}}, handlers...)
	}
	resp := &runtimeapi.StatusResponse{
		Status:          &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{runtimeReady, networkReady}},
		RuntimeHandlers: handlers,
		Features:        &runtimeapi.RuntimeFeatures{SupplementalGroupsPolicy: false},
	}
	if req.GetVerbose() {
		info := map[string]any{"config": s.cfg, "cocoonBinary": s.cocoon.Binary(), "cocoonCheckedAt": probe.At}
		if len(s.store.Quarantined) > 0 {
			info["quarantinedRecords"] = s.store.Quarantined
		}
		if probe.Value != nil {
			info["cocoonVersion"] = probe.Value
		}
		if pools := s.pools.info(); len(pools) > 0 {
			info["warmPools"] = pools
		}
		if caps, err := s.cocoon.Capabilities(ctx); err == nil {
			info["stateMobility"] = stateMobility(caps)
		}
		var err error
		if resp.Info, err = verboseInfo(info); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// handlerFeatures: a VM guest gets neither recursive read-only host mounts nor user namespaces
// from the host kernel, so the kubelet must not ask for them.
func handlerFeatures() *runtimeapi.RuntimeHandlerFeatures {
	return &runtimeapi.RuntimeHandlerFeatures{RecursiveReadOnlyMounts: false, UserNamespaces: false}
}

// probeTimeout bounds one cocoon version call; the kubelet's Status deadline is longer.
const probeTimeout = 5 * time.Second

// newCocoonHealth answers "does cocoon run?" from a cocoon version call at most interval old.
func newCocoonHealth(c Cocoon, interval time.Duration) *refresh.Value[*cocoon.VersionInfo] {
	return refresh.New(interval, probeTimeout, c.Version)
}

// StateMobilityInfo tells an operator, in crictl info, how a VM pod's state moves with this
// node's cocoon, before anything is tried. CheckpointContainer, RestorePod and forks work with
// every cocoon cocoon-cri runs on (docs/checkpoint.md).
type StateMobilityInfo struct {
	// PodCheckpoint is what CheckpointPod writes of each container: "snapshotDirectory", cloned in
	// place at the restore (cocoon v0.3.9 on), or "archive", imported into cocoon at the restore.
	PodCheckpoint string `json:"podCheckpoint"`
	// Hibernate: an idle VM pod can be hibernated and woken (docs/hibernation.md); if not,
	// HibernateUnavailable says why.
	Hibernate            bool   `json:"hibernate"`
	HibernateUnavailable string `json:"hibernateUnavailable,omitempty"`
}

func stateMobility(caps cocoon.Capabilities) StateMobilityInfo {
	info := StateMobilityInfo{PodCheckpoint: "archive", Hibernate: caps.Hibernate}
	if caps.SnapshotDirs {
		info.PodCheckpoint = "snapshotDirectory"
	}
	if !caps.Hibernate {
		info.HibernateUnavailable = noHibernate(caps)
	}
	return info
}

// noHibernate says why cocoon cannot hibernate a VM.
func noHibernate(caps cocoon.Capabilities) string {
	return fmt.Sprintf("cocoon %s has no vm hibernate (v0.5 and later have)", caps.Version)
}
