package imagestore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// Credentials authenticate a pull, as the CRI's AuthConfig carries them. All empty is anonymous.
type Credentials struct {
	Username, Password string
	// Auth is base64("username:password").
	Auth          string
	IdentityToken string
	RegistryToken string
}

func (c Credentials) authenticator() authn.Authenticator {
	if c == (Credentials{}) {
		return authn.Anonymous
	}
	return authn.FromConfig(authn.AuthConfig{
		Username: c.Username, Password: c.Password, Auth: c.Auth,
		IdentityToken: c.IdentityToken, RegistryToken: c.RegistryToken,
	})
}

// registryClient reaches registries: TLS with the system roots plus the configured CA, plain HTTP
// only where it is allowed.
type registryClient struct {
	base     http.RoundTripper
	insecure map[string]bool // host or host:port
}

func newRegistryClient(insecure []string, caFile string) (*registryClient, error) {
	// Without a CA file the roots stay nil: crypto/tls then loads the system's on the first TLS
	// pull, not at every start of the daemon (which then read and parsed the whole of
	// /etc/ssl/certs before answering, docs/profiles.md).
	var roots *x509.CertPool
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("registry CA file: %w", err)
		}
		if roots, err = x509.SystemCertPool(); err != nil {
			roots = x509.NewCertPool()
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("registry CA file %s holds no PEM certificate", caFile)
		}
	}
	rc := &registryClient{insecure: map[string]bool{}}
	for _, h := range insecure {
		if h == "" || strings.Contains(h, "/") {
			return nil, fmt.Errorf("insecure registry %q: want host or host:port", h)
		}
		rc.insecure[h] = true
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	rc.base = plainHTTPGuard{next: t, allowed: rc.plainHTTPAllowed}
	return rc, nil
}

// plainHTTPAllowed says whether a registry may be spoken to without TLS: loopback always (as
// every container runtime allows), others only when configured insecure.
func (rc *registryClient) plainHTTPAllowed(hostport string) bool {
	host := hostOf(hostport)
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback()) || rc.configuredInsecure(hostport)
}

// configuredInsecure says whether hostport is in --registry-insecure, by itself or by its host.
func (rc *registryClient) configuredInsecure(hostport string) bool {
	return rc.insecure[hostport] || rc.insecure[hostOf(hostport)]
}

// hostOf is hostport's host, or hostport itself when it has no port.
func hostOf(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

// plainHTTPGuard refuses plain-HTTP requests to hosts that may not get them. go-containerregistry
// itself falls back to HTTP for private networks too, which an operator has not agreed to.
type plainHTTPGuard struct {
	next    http.RoundTripper
	allowed func(hostport string) bool
}

func (g plainHTTPGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && !g.allowed(req.URL.Host) {
		return nil, fmt.Errorf("plain HTTP to %s refused: list it in --registry-insecure to allow it", req.URL.Host)
	}
	return g.next.RoundTrip(req)
}

// parse reads a normalized reference for go-containerregistry, marking configured insecure
// registries so that it tries plain HTTP for them.
func (rc *registryClient) parse(ref string) (name.Reference, error) {
	parsed, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("image reference %q: %v: %w", ref, err, ErrInvalid)
	}
	if rc.configuredInsecure(parsed.Context().RegistryStr()) {
		if parsed, err = name.ParseReference(ref, name.Insecure); err != nil {
			return nil, fmt.Errorf("image reference %q: %v: %w", ref, err, ErrInvalid)
		}
	}
	return parsed, nil
}

// registrySession reads one repository with one set of credentials.
type registrySession struct {
	repo      name.Repository
	transport http.RoundTripper
	client    *http.Client
}

// connect authenticates to the repository's registry for pulling.
func (rc *registryClient) connect(ctx context.Context, repo name.Repository, creds Credentials) (*registrySession, error) {
	t, err := transport.NewWithContext(ctx, repo.Registry, creds.authenticator(), rc.base, []string{repo.Scope(transport.PullScope)})
	if err != nil {
		return nil, registryError(repo.RegistryStr(), fmt.Errorf("connect to registry %s: %w", repo.RegistryStr(), err))
	}
	return &registrySession{repo: repo, transport: t, client: &http.Client{Transport: t}}, nil
}

// manifest fetches the manifest or index ref names.
func (rs *registrySession) manifest(ctx context.Context, ref name.Reference) (*remote.Descriptor, error) {
	desc, err := remote.Get(ref, remote.WithTransport(rs.transport), remote.WithContext(ctx))
	if err != nil {
		return nil, registryError(rs.repo.RegistryStr(), fmt.Errorf("get manifest %s: %w", ref, err))
	}
	return desc, nil
}

// open starts the download of one blob of the repository. The caller checks what it reads
// (copyBlob): the registry's answer is not trusted.
func (rs *registrySession) open(ctx context.Context, desc v1.Descriptor) (io.ReadCloser, error) {
	u := url.URL{
		Scheme: rs.repo.Scheme(),
		Host:   rs.repo.RegistryStr(),
		Path:   fmt.Sprintf("/v2/%s/blobs/%s", rs.repo.RepositoryStr(), desc.Digest),
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := rs.client.Do(req)
	if err == nil {
		if err = transport.CheckError(resp, http.StatusOK); err != nil {
			resp.Body.Close() //nolint:errcheck
		}
	}
	if err != nil {
		return nil, registryError(rs.repo.RegistryStr(), fmt.Errorf("get blob %s: %w", desc.Digest, err))
	}
	return resp.Body, nil
}
