package vmruntime

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// The operator's hibernate and wake of one pod (cocoon-cri pod hibernate|wake) travel over the CRI
// socket as one more gRPC service, like the image import: the pod as NAMESPACE/NAME or a sandbox
// ID (prefix) in, the container ID out.
const (
	podsService     = "cocooncri.admin.v1.Pods"
	hibernateMethod = "Hibernate"
	wakeMethod      = "Wake"
)

// RegisterPodControl adds the pod hibernate and wake service to a gRPC server.
func (s *Runtime) RegisterPodControl(g *grpc.Server) {
	method := func(name string, do func(context.Context, string) (string, error)) grpc.MethodDesc {
		return grpc.MethodDesc{MethodName: name, Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := &wrapperspb.StringValue{}
			if err := dec(in); err != nil {
				return nil, err
			}
			call := func(ctx context.Context, req any) (any, error) {
				id, err := do(ctx, req.(*wrapperspb.StringValue).GetValue())
				if err != nil {
					return nil, err
				}
				return wrapperspb.String(id), nil
			}
			if icpt == nil {
				return call(ctx, in)
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{Server: s, FullMethod: "/" + podsService + "/" + name}, call)
		}}
	}
	g.RegisterService(&grpc.ServiceDesc{
		ServiceName: podsService,
		HandlerType: (*any)(nil),
		Methods:     []grpc.MethodDesc{method(hibernateMethod, s.hibernatePod), method(wakeMethod, s.wakePod)},
	}, s)
}

// HibernatePod asks the daemon behind conn to hibernate a pod's VM now; WakePod to wake it. Both
// return the container ID.
func HibernatePod(ctx context.Context, conn grpc.ClientConnInterface, pod string) (string, error) {
	return callPodControl(ctx, conn, hibernateMethod, pod)
}

// WakePod: see HibernatePod.
func WakePod(ctx context.Context, conn grpc.ClientConnInterface, pod string) (string, error) {
	return callPodControl(ctx, conn, wakeMethod, pod)
}

func callPodControl(ctx context.Context, conn grpc.ClientConnInterface, method, pod string) (string, error) {
	var out wrapperspb.StringValue
	if err := conn.Invoke(ctx, "/"+podsService+"/"+method, wrapperspb.String(pod), &out); err != nil {
		return "", err
	}
	return out.GetValue(), nil
}

// hibernatePod hibernates a pod's running VM now, whatever its idle period; one that hibernates
// already is left so. It wakes on use as any hibernated pod does.
func (s *Runtime) hibernatePod(ctx context.Context, pod string) (string, error) {
	c, err := s.podContainer(pod)
	if err != nil {
		return "", err
	}
	switch err := s.Hibernate(ctx, c.ID); {
	case errors.Is(err, errNothingToDo):
		return c.ID, nil
	case err != nil:
		var refusal *hibernationRefusal
		if errors.As(err, &refusal) {
			return "", precondition("pod %s cannot hibernate: %s", pod, refusal.why)
		}
		return "", err
	}
	return c.ID, nil
}

// wakePod wakes a pod's hibernated VM; an awake one is left so.
func (s *Runtime) wakePod(ctx context.Context, pod string) (string, error) {
	c, err := s.podContainer(pod)
	if err != nil {
		return "", err
	}
	if err := s.Wake(ctx, c.ID); err != nil {
		return "", unavailable("pod %s could not be woken: %v", pod, err)
	}
	return c.ID, nil
}

// podContainer is the running container of a pod named NAMESPACE/NAME (its ready sandbox) or by
// sandbox ID or ID prefix.
func (s *Runtime) podContainer(pod string) (*store.Container, error) {
	if pod == "" {
		return nil, invalid("name a pod: NAMESPACE/NAME or its sandbox ID")
	}
	var sb *store.Sandbox
	if namespace, name, ok := strings.Cut(pod, "/"); ok {
		ready := s.store.Sandboxes.List(func(sb *store.Sandbox) bool {
			md := sb.Config.Msg.GetMetadata()
			return sb.State == store.SandboxReady && md.GetNamespace() == namespace && md.GetName() == name
		})
		if len(ready) == 0 {
			return nil, notFound("no ready VM pod %s on this node", pod)
		}
		sb = ready[0]
	} else {
		var err error
		if sb, err = s.visibleSandbox(pod); isNotFound(err) {
			return nil, notFound("no VM pod %s on this node", pod)
		} else if err != nil {
			return nil, err
		}
	}
	if c := s.runningContainerOf(sb.ID); c != nil {
		return c, nil
	}
	return nil, precondition("pod %s runs no VM", pod)
}
