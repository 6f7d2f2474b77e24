package metrics

import (
	"strings"
	"time"

	"google.golang.org/grpc/codes"
)

// RPCDone counts and times one CRI RPC: a unary call when it answers, a stream (GetContainerEvents,
// image import) when it ends, so a stream the kubelet holds open for hours is counted then.
// runtime says who served it: "cocoon", "passthrough", or "both" for merged answers.
func (m *Metrics) RPCDone(fullMethod, runtime string, took time.Duration, code codes.Code) {
	service, method := splitMethod(fullMethod)
	m.rpcs.WithLabelValues(service, method, runtime, code.String()).Inc()
	m.rpcSeconds.WithLabelValues(service, method, runtime).Observe(took.Seconds())
}

// RPCOwnTime records the part of a unary RPC's time that was cocoon-cri's own, the rest having
// been spent waiting on cocoon, CNI plugins or the passthrough runtime.
func (m *Metrics) RPCOwnTime(fullMethod, runtime string, own time.Duration) {
	service, method := splitMethod(fullMethod)
	m.rpcOwnSeconds.WithLabelValues(service, method, runtime).Observe(own.Seconds())
}

// splitMethod splits gRPC's "/runtime.v1.RuntimeService/RunPodSandbox" into its service and method.
func splitMethod(fullMethod string) (service, method string) {
	fullMethod = strings.TrimPrefix(fullMethod, "/")
	if i := strings.LastIndexByte(fullMethod, '/'); i >= 0 {
		return fullMethod[:i], fullMethod[i+1:]
	}
	return "unknown", fullMethod
}
