// Package grpcerr turns an error of cocoon-cri's layers into a gRPC status, once, at the edge (the
// CRI interceptor). The layers below say what kind of failure they had with containerd's errdefs:
// their sentinel errors wrap one of its kinds, and the VM runtime's refusals are one with their
// own message. Nothing here knows a lower package.
package grpcerr

import (
	"context"
	"errors"
	"syscall"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ToStatus maps err to a gRPC status with err's message. An error that already carries a status
// keeps it: every answer of the passthrough runtime does.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(Code(err), err.Error())
}

// Code is the gRPC code ToStatus gives err.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	if st, ok := status.FromError(err); ok {
		return st.Code()
	}
	// The deadline and cancellation come first, whatever a layer made of them on the way.
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	}
	// The outermost kind wins: a snapshot whose base cannot be pulled is a failed precondition,
	// even when cocoon's reason inside it is a not-found.
	if code, ok := kindCodes[errdefs.Resolve(err)]; ok {
		return code
	}
	if errors.Is(err, syscall.ENOSPC) {
		return codes.ResourceExhausted
	}
	return codes.Internal
}

var kindCodes = map[error]codes.Code{
	errdefs.ErrInvalidArgument:    codes.InvalidArgument,
	errdefs.ErrNotFound:           codes.NotFound,
	errdefs.ErrAlreadyExists:      codes.AlreadyExists,
	errdefs.ErrPermissionDenied:   codes.PermissionDenied,
	errdefs.ErrResourceExhausted:  codes.ResourceExhausted,
	errdefs.ErrFailedPrecondition: codes.FailedPrecondition,
	errdefs.ErrConflict:           codes.Aborted,
	errdefs.ErrAborted:            codes.Aborted,
	errdefs.ErrOutOfRange:         codes.OutOfRange,
	errdefs.ErrNotImplemented:     codes.Unimplemented,
	errdefs.ErrInternal:           codes.Internal,
	errdefs.ErrUnavailable:        codes.Unavailable,
	errdefs.ErrDataLoss:           codes.DataLoss,
	errdefs.ErrUnauthenticated:    codes.Unauthenticated,
}
