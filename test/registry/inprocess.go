package registry

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
)

// StartInProcess serves go-containerregistry's in-memory registry on loopback until the test ends,
// behind basic auth when user is set: lighter than a server process, for tests that need no
// on-disk storage or network namespace.
func StartInProcess(t testing.TB, user, password string) Target {
	t.Helper()
	var handler http.Handler = ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	target := Target{}
	if user != "" {
		handler = basicAuth(handler, user, password)
		target.Auth = &authn.Basic{Username: user, Password: password}
	}
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	target.Host = strings.TrimPrefix(srv.URL, "http://")
	return target
}

// basicAuth answers as a registry with htpasswd authentication does.
func basicAuth(next http.Handler, user, password string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != password {
			w.Header().Set("WWW-Authenticate", `Basic realm="cocoon-cri-test"`)
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`) //nolint:errcheck
			return
		}
		next.ServeHTTP(w, r)
	})
}
