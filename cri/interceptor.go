package cri

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/cocoonstack/cocoon-cri/cri/grpcerr"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cocoonstack/cocoon-cri/pkg/waittime"
)

// Who served an RPC, in logs and metrics.
const (
	servedByVM          = "cocoon"
	servedByPassthrough = "passthrough"
	servedByBoth        = "both"
)

// RPCObserver is told of every RPC when it ends; pkg/metrics implements it. It must not block.
type RPCObserver interface {
	RPCDone(fullMethod, runtime string, took time.Duration, code codes.Code)
	// RPCOwnTime is, for a unary RPC, the part of its time not spent waiting on cocoon, the CNI
	// plugins or the passthrough runtime (pkg/waittime): cocoon-cri's own cost.
	RPCOwnTime(fullMethod, runtime string, own time.Duration)
}

// servedBy records, for the interceptor, which runtime the router chose for the RPC in progress.
type servedBy struct {
	mu      sync.Mutex
	runtime string
}

type servedByKey struct{}

// serve notes in ctx which runtime serves the RPC; a call outside the interceptor (a unit test)
// has nothing to note it in.
func serve(ctx context.Context, runtime string) {
	if s, ok := ctx.Value(servedByKey{}).(*servedBy); ok {
		s.mu.Lock()
		s.runtime = runtime
		s.mu.Unlock()
	}
}

func (s *servedBy) get() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runtime
}

// Interceptors return the one place where every RPC, of either runtime, gets its error mapped to
// a gRPC status, its log line and its metrics.
func Interceptors(log *slog.Logger, obs RPCObserver) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		by := &servedBy{runtime: servedByVM}
		ctx, waits := waittime.New(context.WithValue(ctx, servedByKey{}, by))
		resp, err := handler(ctx, req)
		err = grpcerr.ToStatus(err)
		took := time.Since(start)
		if obs != nil {
			obs.RPCOwnTime(info.FullMethod, by.get(), max(took-waits.Close(), 0))
		}
		done(log, obs, info.FullMethod, by.get(), took, err)
		return resp, err
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		by := &servedBy{runtime: servedByVM}
		err := grpcerr.ToStatus(handler(srv, &servingStream{ServerStream: ss, ctx: context.WithValue(ss.Context(), servedByKey{}, by)}))
		done(log, obs, info.FullMethod, by.get(), time.Since(start), err)
		return err
	}
	return unary, stream
}

// servingStream carries the servedBy note to a streaming handler.
type servingStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *servingStream) Context() context.Context { return s.ctx }

func done(log *slog.Logger, obs RPCObserver, method, runtime string, took time.Duration, err error) {
	code := grpcerr.Code(err)
	if obs != nil {
		obs.RPCDone(method, runtime, took, code)
	}
	switch code {
	case codes.OK:
		log.Debug("rpc", "method", method, "runtime", runtime, "took", took)
	case codes.Internal, codes.Unknown, codes.DataLoss:
		log.Error("rpc failed", "method", method, "runtime", runtime, "took", took, "code", code, "err", status.Convert(err).Message())
	default:
		// Refusals, NotFound of a status call and a passthrough runtime that is down are the
		// caller's to act on; the kubelet logs them too.
		log.Info("rpc failed", "method", method, "runtime", runtime, "took", took, "code", code, "err", status.Convert(err).Message())
	}
}
