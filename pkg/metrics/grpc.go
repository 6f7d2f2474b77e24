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

// splitMethod splits gRPC's "/runtime.v1.RuntimeService/RunPodSandbox" into its service and method.
func splitMethod(fullMethod string) (service, method string) {
	fullMethod = strings.TrimPrefix(fullMethod, "/")
	if i := strings.LastIndexByte(fullMethod, '/'); i >= 0 {
		return fullMethod[:i], fullMethod[i+1:]
	}
	return "unknown", fullMethod
}
