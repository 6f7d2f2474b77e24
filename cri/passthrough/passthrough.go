// Package passthrough is the node's container runtime (containerd, CRI-O) as a backend of the CRI
// edge: every request goes to it unchanged over its CRI socket, and its answer comes back unchanged,
// the URLs of its own stream server included. Only the errors of a runtime that does not answer
// are reworded, to name it.
package passthrough

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/waittime"
)

// maxMsgSize is the kubelet's own limit for CRI messages: a list the kubelet can take from the
// runtime directly must pass through too.
const maxMsgSize = 16 << 20

// reconnect is how the connection comes back after the runtime restarts: quickly, since the node
// is not Ready meanwhile, and without the default's two-minute ceiling.
var reconnect = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
	MinConnectTimeout: 5 * time.Second,
}

// Runtime forwards the CRI to another runtime. It implements runtimeapi.RuntimeServiceServer and
// runtimeapi.ImageServiceServer. Calls fail at once with Unavailable while the runtime is down, and
// the connection is made again in the background; each call keeps its caller's deadline.
type Runtime struct {
	runtimeapi.UnsafeRuntimeServiceServer
	runtimeapi.UnsafeImageServiceServer

	endpoint string
	conn     *grpc.ClientConn
	rt       runtimeapi.RuntimeServiceClient
	img      runtimeapi.ImageServiceClient
}

// Dial prepares a connection to the runtime at endpoint, a unix socket ("unix:///run/containerd/
// containerd.sock", or its path). Nothing is sent yet: a runtime that is down at start is reached
// once it is up.
func Dial(endpoint string) (*Runtime, error) {
	target, err := unixTarget(endpoint)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(reconnect),
		grpc.WithChainUnaryInterceptor(accountWait),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsgSize), grpc.MaxCallSendMsgSize(maxMsgSize)))
	if err != nil {
		return nil, fmt.Errorf("passthrough endpoint %s: %w", endpoint, err)
	}
	return &Runtime{endpoint: endpoint, conn: conn,
		rt: runtimeapi.NewRuntimeServiceClient(conn), img: runtimeapi.NewImageServiceClient(conn)}, nil
}

// CheckEndpoint says whether endpoint can be dialled, for a configuration check at start.
func CheckEndpoint(endpoint string) error {
	_, err := unixTarget(endpoint)
	return err
}

// unixTarget checks endpoint and returns it as a gRPC target: the kubelet reaches runtimes over
// unix sockets only, and so does cocoon-cri.
func unixTarget(endpoint string) (string, error) {
	path, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok {
		if strings.Contains(endpoint, "://") {
			return "", fmt.Errorf("passthrough endpoint %q: only unix sockets are supported (unix:///run/containerd/containerd.sock)", endpoint)
		}
		path = endpoint
	}
	if !strings.HasPrefix(path, "/") {
		return "", fmt.Errorf("passthrough endpoint %q: the socket path must be absolute (unix:///run/containerd/containerd.sock)", endpoint)
	}
	return "unix://" + path, nil
}

// Endpoint is the runtime's address, as configured.
func (r *Runtime) Endpoint() string { return r.endpoint }

// Close ends the connection.
func (r *Runtime) Close() error { return r.conn.Close() }

// reword names the runtime in the errors of a runtime that does not answer; its other answers,
// NotFound included, come back as they are.
func (r *Runtime) reword(err error) error {
	if err == nil {
		return nil
	}
	st := status.Convert(err)
	switch st.Code() {
	case codes.Unavailable:
		return status.Errorf(codes.Unavailable, "passthrough runtime %s is unavailable: %s", r.endpoint, st.Message())
	case codes.DeadlineExceeded:
		return status.Errorf(codes.DeadlineExceeded, "passthrough runtime %s did not answer in time: %s", r.endpoint, st.Message())
	}
	return err
}

// call forwards one unary request.
func call[Req, Resp any](ctx context.Context, r *Runtime, rpc func(context.Context, Req, ...grpc.CallOption) (Resp, error), req Req) (Resp, error) {
	resp, err := rpc(ctx, req)
	return resp, r.reword(err)
}

// relay forwards one server-streaming request: every message the runtime sends, then its end.
func relay[Req, Resp any](r *Runtime, out grpc.ServerStreamingServer[Resp], open func(context.Context, Req, ...grpc.CallOption) (grpc.ServerStreamingClient[Resp], error), req Req) error {
	in, err := open(out.Context(), req)
	if err != nil {
		return r.reword(err)
	}
	for {
		msg, err := in.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return r.reword(err)
		}
		if err := out.Send(msg); err != nil {
			return err
		}
	}
}

// accountWait counts a call to the peer runtime as time the RPC waited on it: what is left is
// what passing through costs.
func accountWait(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	defer waittime.Begin(ctx)()
	return invoker(ctx, method, req, reply, cc, opts...)
}
