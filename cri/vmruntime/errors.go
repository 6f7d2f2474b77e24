package vmruntime

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// The VM runtime's refusals: an errdefs kind with the message the user reads. The CRI edge
// (cri/grpcerr) makes them gRPC statuses; nothing here knows gRPC's codes.

func invalid(format string, args ...any) error {
	return errdefs.ErrInvalidArgument.WithMessage(fmt.Sprintf(format, args...))
}

func precondition(format string, args ...any) error {
	return errdefs.ErrFailedPrecondition.WithMessage(fmt.Sprintf(format, args...))
}

// unimplemented answers an RPC cocoon-cri does not serve, saying what to do instead.
func unimplemented(rpc, instead string) error {
	return errdefs.ErrNotImplemented.WithMessage(fmt.Sprintf("cocoon-cri does not implement %s: %s", rpc, instead))
}

// isNotFound reports a missing record or cocoon object: the case idempotent stops and removes
// treat as done.
func isNotFound(err error) bool {
	return errors.Is(err, store.ErrNotFound) || errors.Is(err, cocoon.ErrNotFound)
}

func alreadyExists(format string, args ...any) error {
	return errdefs.ErrAlreadyExists.WithMessage(fmt.Sprintf(format, args...))
}

func permissionDenied(format string, args ...any) error {
	return errdefs.ErrPermissionDenied.WithMessage(fmt.Sprintf(format, args...))
}

func unavailable(format string, args ...any) error {
	return errdefs.ErrUnavailable.WithMessage(fmt.Sprintf(format, args...))
}

func notFound(format string, args ...any) error {
	return errdefs.ErrNotFound.WithMessage(fmt.Sprintf(format, args...))
}

func resourceExhausted(format string, args ...any) error {
	return errdefs.ErrResourceExhausted.WithMessage(fmt.Sprintf(format, args...))
}

// timedOut is a deadline told in the runtime's own words: it is context.DeadlineExceeded to
// errors.Is, and so to the edge.
func timedOut(format string, args ...any) error {
	return deadlineError(fmt.Sprintf(format, args...))
}

type deadlineError string

func (e deadlineError) Error() string { return string(e) }

func (deadlineError) Is(target error) bool { return target == context.DeadlineExceeded }
