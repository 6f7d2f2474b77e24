package vmruntime

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

func precondition(format string, args ...any) error {
	return status.Errorf(codes.FailedPrecondition, format, args...)
}

// unimplemented answers an RPC cocoon-cri does not serve, saying what to do instead.
func unimplemented(rpc, instead string) error {
	return status.Error(codes.Unimplemented, fmt.Sprintf("cocoon-cri does not implement %s: %s", rpc, instead))
}

// isNotFound reports a missing record or cocoon object: the case idempotent stops and removes
// treat as done.
func isNotFound(err error) bool {
	return errors.Is(err, store.ErrNotFound) || errors.Is(err, cocoon.ErrNotFound)
}

func alreadyExists(format string, args ...any) error {
	return status.Errorf(codes.AlreadyExists, format, args...)
}

func permissionDenied(format string, args ...any) error {
	return status.Errorf(codes.PermissionDenied, format, args...)
}

func unavailable(format string, args ...any) error {
	return status.Errorf(codes.Unavailable, format, args...)
}

func notFound(format string, args ...any) error {
	return status.Errorf(codes.NotFound, format, args...)
}
