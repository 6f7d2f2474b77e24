package grpcerr_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cocoonstack/cocoon-cri/cri/grpcerr"
	"github.com/cocoonstack/cocoon-cri/imagestore"
	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// The lower layers' sentinels keep the codes the edge gave them when it matched each by name.
func TestSentinelsKeepTheirCodes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{store.ErrNotFound, codes.NotFound},
		{store.ErrExists, codes.AlreadyExists},
		{store.ErrAmbiguous, codes.InvalidArgument},
		{cocoon.ErrNotFound, codes.NotFound},
		{cocoon.ErrAlreadyExists, codes.AlreadyExists},
		{cocoon.ErrInvalid, codes.InvalidArgument},
		{cocoon.ErrInUse, codes.FailedPrecondition},
		{cocoon.ErrNoSpace, codes.ResourceExhausted},
		{cocoon.ErrUnsupported, codes.Unimplemented},
		{imagestore.ErrNotFound, codes.NotFound},
		{imagestore.ErrInvalid, codes.InvalidArgument},
		{imagestore.ErrBaseUnavailable, codes.FailedPrecondition},
		{imagestore.ErrUnauthenticated, codes.Unauthenticated},
		{imagestore.ErrPermissionDenied, codes.PermissionDenied},
		{imagestore.ErrUnreachable, codes.Unavailable},
		{imagestore.ErrCorrupt, codes.DataLoss},
	} {
		wrapped := fmt.Errorf("container abc: %w", tc.err)
		st, _ := status.FromError(grpcerr.ToStatus(wrapped))
		if st.Code() != tc.want || st.Message() != wrapped.Error() {
			t.Errorf("%v: %s %q, want %s with the message unchanged", tc.err, st.Code(), st.Message(), tc.want)
		}
	}
	// Each package's sentinels stay its own: a store miss is no cocoon miss.
	if errors.Is(store.ErrNotFound, cocoon.ErrNotFound) || errors.Is(cocoon.ErrNotFound, store.ErrNotFound) {
		t.Error("store.ErrNotFound and cocoon.ErrNotFound match each other")
	}
}

func TestTheOutermostKindWins(t *testing.T) {
	// cocoon's reason for a failed pull of a snapshot's base is a not-found of the base.
	err := fmt.Errorf("%w: example.com/base, and cocoon could not pull it: %w", imagestore.ErrBaseUnavailable, cocoon.ErrNotFound)
	if got := grpcerr.Code(err); got != codes.FailedPrecondition {
		t.Errorf("a base that cannot be pulled: %s, want FailedPrecondition", got)
	}
	if got := grpcerr.Code(errdefs.ErrInvalidArgument.WithMessage("bad")); got != codes.InvalidArgument {
		t.Errorf("a refusal: %s", got)
	}
}

func TestDeadlinesAndTheRest(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{"nil", nil, codes.OK},
		{"a deadline inside a kind", fmt.Errorf("%w: %w", cocoon.ErrNotFound, context.DeadlineExceeded), codes.DeadlineExceeded},
		{"cancelled", fmt.Errorf("clone: %w", context.Canceled), codes.Canceled},
		{"a full disk", &os.PathError{Op: "write", Path: "/x", Err: syscall.ENOSPC}, codes.ResourceExhausted},
		{"anything else", errors.New("boom"), codes.Internal},
		{"a status of the passthrough runtime", status.Error(codes.Aborted, "containerd says"), codes.Aborted},
	} {
		if got := grpcerr.Code(tc.err); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
	passthrough := status.Error(codes.Aborted, "containerd says")
	if got := grpcerr.ToStatus(passthrough); got != passthrough {
		t.Errorf("a status is not kept as it is: %v", got)
	}
	if grpcerr.ToStatus(nil) != nil {
		t.Error("ToStatus(nil) is not nil")
	}
}
