package cri

import (
	"context"
	"errors"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cocoonstack/cocoon-cri/imagestore"
	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// toStatus maps an error from the layers below to a gRPC status, once, at the edge. Errors that
// already carry a status keep it: the VM runtime's own refusals, and every answer of the
// passthrough runtime.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codeOf(err), err.Error())
}

func codeOf(err error) codes.Code {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, imagestore.ErrBaseUnavailable):
		// Before the rest: cocoon's reason inside may be a NotFound of the base, not the image.
		return codes.FailedPrecondition
	case errors.Is(err, store.ErrNotFound), errors.Is(err, cocoon.ErrNotFound), errors.Is(err, imagestore.ErrNotFound):
		return codes.NotFound
	case errors.Is(err, store.ErrExists), errors.Is(err, cocoon.ErrAlreadyExists):
		return codes.AlreadyExists
	case errors.Is(err, store.ErrAmbiguous), errors.Is(err, cocoon.ErrInvalid), errors.Is(err, imagestore.ErrInvalid):
		return codes.InvalidArgument
	case errors.Is(err, cocoon.ErrInUse):
		return codes.FailedPrecondition
	case errors.Is(err, cocoon.ErrNoSpace), errors.Is(err, syscall.ENOSPC):
		return codes.ResourceExhausted
	case errors.Is(err, cocoon.ErrUnsupported):
		return codes.Unimplemented
	case errors.Is(err, imagestore.ErrUnauthenticated):
		return codes.Unauthenticated
	case errors.Is(err, imagestore.ErrPermissionDenied):
		return codes.PermissionDenied
	case errors.Is(err, imagestore.ErrUnreachable):
		return codes.Unavailable
	case errors.Is(err, imagestore.ErrCorrupt):
		return codes.DataLoss
	}
	return codes.Internal
}

// isUnreachable reports an error of a runtime that did not answer (down, or too slow to), as
// against one that answered with a refusal.
func isUnreachable(err error) bool {
	code := status.Code(err)
	return code == codes.Unavailable || code == codes.DeadlineExceeded
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}
