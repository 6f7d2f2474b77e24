package imagestore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"

	"github.com/containerd/errdefs"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// What a registry can answer, for callers to tell apart with errors.Is; each is of an errdefs kind.
var (
	// ErrUnauthenticated: the registry wants credentials, or did not accept the ones given.
	ErrUnauthenticated = errdefs.ErrUnauthenticated.WithMessage("registry authentication failed")
	// ErrPermissionDenied: the credentials do not grant access to the repository.
	ErrPermissionDenied = errdefs.ErrPermissionDenied.WithMessage("registry access denied")
	// ErrUnreachable: the registry did not answer.
	ErrUnreachable = errdefs.ErrUnavailable.WithMessage("registry unreachable")
	// ErrCorrupt: content does not match the digest or size its manifest gives.
	ErrCorrupt = errdefs.ErrDataLoss.WithMessage("registry content does not match its digest")
)

// registryError classifies a failure of a request to registry.
func registryError(registry string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var terr *transport.Error
	if errors.As(err, &terr) {
		switch {
		case terr.StatusCode == http.StatusUnauthorized || hasCode(terr, transport.UnauthorizedErrorCode):
			return fmt.Errorf("registry %s refused the request without valid credentials (%w): %v", registry, ErrUnauthenticated, err)
		case terr.StatusCode == http.StatusForbidden || hasCode(terr, transport.DeniedErrorCode):
			return fmt.Errorf("registry %s denied access (%w): %v", registry, ErrPermissionDenied, err)
		case terr.StatusCode == http.StatusNotFound || hasCode(terr, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode):
			return fmt.Errorf("%w in registry %s: %v", ErrNotFound, registry, err)
		}
		return err
	}
	var opErr *net.OpError
	var dnsErr *net.DNSError
	if errors.As(err, &opErr) || errors.As(err, &dnsErr) {
		return fmt.Errorf("%w: %v", ErrUnreachable, err)
	}
	return err
}

func hasCode(err *transport.Error, codes ...transport.ErrorCode) bool {
	return slices.ContainsFunc(err.Errors, func(d transport.Diagnostic) bool { return slices.Contains(codes, d.Code) })
}
