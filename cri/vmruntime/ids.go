package vmruntime

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// newID returns a 64-hex-digit ID, the shape crictl and the kubelet know from other runtimes.
func newID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b)
}

// sandboxName is unique per pod attempt: the kubelet makes a new attempt when it recreates a
// sandbox, and retries of one attempt must find the first one.
func sandboxName(md *runtimeapi.PodSandboxMetadata) string {
	return strings.Join([]string{md.GetName(), md.GetNamespace(), md.GetUid(), fmt.Sprint(md.GetAttempt())}, "_")
}

// containerName is unique per container attempt within a sandbox.
func containerName(md *runtimeapi.ContainerMetadata, sandboxName string) string {
	return strings.Join([]string{md.GetName(), sandboxName, fmt.Sprint(md.GetAttempt())}, "_")
}
