package cri

import (
	"google.golang.org/grpc/codes"

	"github.com/cocoonstack/cocoon-cri/cri/grpcerr"
)

// isUnreachable reports an error of a runtime that did not answer (down, or too slow to), as
// against one that answered with a refusal.
func isUnreachable(err error) bool {
	code := grpcerr.Code(err)
	return code == codes.Unavailable || code == codes.DeadlineExceeded
}
