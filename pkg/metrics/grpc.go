package metrics

import (
	"context"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// UnaryServerInterceptor counts and times every unary RPC.
func (m *Metrics) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		m.rpcDone(info.FullMethod, time.Since(start), err)
		return resp, err
	}
}

// StreamServerInterceptor counts and times every streaming RPC (GetContainerEvents, image import)
// when it ends; a stream the kubelet holds open for hours is counted then, not while it lasts.
func (m *Metrics) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		err := handler(srv, ss)
		m.rpcDone(info.FullMethod, time.Since(start), err)
		return err
	}
}

func (m *Metrics) rpcDone(fullMethod string, took time.Duration, err error) {
	service, method := splitMethod(fullMethod)
	// status.Code maps nil to OK and an error that carries no status to Unknown, as the client sees it.
	m.rpcs.WithLabelValues(service, method, status.Code(err).String()).Inc()
	m.rpcSeconds.WithLabelValues(service, method).Observe(took.Seconds())
}

// splitMethod splits gRPC's "/runtime.v1.RuntimeService/RunPodSandbox" into its service and method.
func splitMethod(fullMethod string) (service, method string) {
	fullMethod = strings.TrimPrefix(fullMethod, "/")
	if i := strings.LastIndexByte(fullMethod, '/'); i >= 0 {
		return fullMethod[:i], fullMethod[i+1:]
	}
	return "unknown", fullMethod
}
