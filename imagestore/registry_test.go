package imagestore

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/cocoonstack/cocoon-cri/test/registry"
)

func TestPlainHTTPOnlyForLoopbackAndInsecureRegistries(t *testing.T) {
	rc, err := newRegistryClient([]string{"registry.lan:5000", "10.1.2.3"}, "")
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]bool{
		"127.0.0.1:5000":    true,
		"localhost:5000":    true,
		"[::1]:5000":        true,
		"registry.lan:5000": true,
		"registry.lan:6000": false,
		"10.1.2.3:443":      true,
		"10.1.2.4:5000":     false, // a private address is not enough
		"docker.io":         false,
	}
	for host, want := range cases {
		if got := rc.plainHTTPAllowed(host); got != want {
			t.Errorf("%s: plain HTTP allowed %v, want %v", host, got, want)
		}
	}
	if _, err := rc.base.RoundTrip(&http.Request{Method: http.MethodGet, URL: mustURL(t, "http://10.1.2.4:5000/v2/")}); err == nil {
		t.Fatal("a plain HTTP request to a private address went out")
	}
	ref, err := rc.parse("registry.lan:5000/app:v1")
	if err != nil || ref.Context().Scheme() != "http" {
		t.Fatalf("an insecure registry is not tried over HTTP: %v %v", ref, err)
	}
	for _, bad := range []string{"", "http://registry.lan"} {
		if _, err := newRegistryClient([]string{bad}, ""); err == nil {
			t.Errorf("insecure registry %q accepted", bad)
		}
	}
}

func TestRegistryErrorsAreClassified(t *testing.T) {
	cases := []struct {
		err  error
		want error
	}{
		{&transport.Error{StatusCode: http.StatusUnauthorized}, ErrUnauthenticated},
		{&transport.Error{StatusCode: http.StatusForbidden, Errors: []transport.Diagnostic{{Code: transport.DeniedErrorCode}}}, ErrPermissionDenied},
		{&transport.Error{StatusCode: http.StatusNotFound, Errors: []transport.Diagnostic{{Code: transport.ManifestUnknownErrorCode}}}, ErrNotFound},
		{&transport.Error{StatusCode: http.StatusNotFound, Errors: []transport.Diagnostic{{Code: transport.NameUnknownErrorCode}}}, ErrNotFound},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, ErrUnreachable},
	}
	for _, tc := range cases {
		err := registryError("reg.example:5000", fmt.Errorf("get manifest: %w", tc.err))
		if !errors.Is(err, tc.want) {
			t.Errorf("%v: classified %v, want %v", tc.err, err, tc.want)
		}
	}
}

func mustURL(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestPullTrustsTheConfiguredCA: a registry whose certificate the system does not trust is pulled
// from when --registry-ca-file holds its CA, and refused otherwise.
func TestPullTrustsTheConfiguredCA(t *testing.T) {
	srv := httptest.NewTLSServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "https://")
	target := registry.Target{Host: host, Transport: srv.Client().Transport}
	if _, err := target.PushCloudImage(context.Background(), "tls/disk:v1", qcow2Disk(t), 1); err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := newTestNode(t, PullOptions{}).svc.Pull(context.Background(), host+"/tls/disk:v1", Credentials{}); err == nil {
		t.Fatal("a registry with an untrusted certificate was pulled from")
	}
	if _, err := newTestNode(t, PullOptions{CAFile: caFile}).svc.Pull(context.Background(), host+"/tls/disk:v1", Credentials{}); err != nil {
		t.Fatalf("pull with the registry's CA: %v", err)
	}
	if _, err := newRegistryClient(nil, filepath.Join(t.TempDir(), "missing.pem")); err == nil {
		t.Fatal("a missing CA file was accepted")
	}
}
