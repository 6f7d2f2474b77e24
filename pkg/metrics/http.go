package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Path is where the metrics are served.
const Path = "/metrics"

// Handler serves the exposition of m's registry. Errors in collecting one metric are logged and
// the rest is served, so one broken collector does not blind the whole scrape.
func (m *Metrics) Handler(log *slog.Logger) http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
		// Also counts the handler's own errors and in-flight scrapes into the registry.
		Registry: m.reg,
		// A scrape that takes longer than this is stuck; Prometheus would have given up already.
		Timeout: 30 * time.Second,
	})
}

// Endpoint is the HTTP server of the metrics, on its own listener so that the CRI socket never
// has to speak HTTP and a slow scraper never holds a CRI connection.
type Endpoint struct {
	srv *http.Server
	lis net.Listener
}

// ProfilingPath is where Go's runtime profiles are served, when asked for.
const ProfilingPath = "/debug/pprof/"

// Listen binds addr (host:port; port 0 picks a free one) for the metrics of m, and with profiling
// for the Go runtime's profiles under ProfilingPath as well (net/http/pprof).
func (m *Metrics) Listen(addr string, log *slog.Logger, profiling bool) (*Endpoint, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics address %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle(Path, m.Handler(log))
	if profiling {
		mux.HandleFunc(ProfilingPath, pprof.Index)
		mux.HandleFunc(ProfilingPath+"cmdline", pprof.Cmdline)
		mux.HandleFunc(ProfilingPath+"profile", pprof.Profile)
		mux.HandleFunc(ProfilingPath+"symbol", pprof.Symbol)
		mux.HandleFunc(ProfilingPath+"trace", pprof.Trace)
	}
	return &Endpoint{lis: lis, srv: &http.Server{
		Handler: mux,
		// Without it a client that sends headers slowly holds a connection forever.
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}}, nil
}

// Addr is the address the endpoint listens on, with the port it got.
func (e *Endpoint) Addr() net.Addr { return e.lis.Addr() }

// Serve serves until Shutdown; it returns nil once shut down.
func (e *Endpoint) Serve() error {
	if err := e.srv.Serve(e.lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve metrics: %w", err)
	}
	return nil
}

// Shutdown stops accepting scrapes and waits for those in progress until ctx ends, then closes
// what is left. It also releases the address of an endpoint that never served.
func (e *Endpoint) Shutdown(ctx context.Context) error {
	err := e.srv.Shutdown(ctx)
	if err != nil {
		_ = e.srv.Close()
	}
	// http.Server only closes listeners that Serve was given; an already closed one reports so.
	_ = e.lis.Close()
	if err != nil {
		return fmt.Errorf("stop metrics server: %w", err)
	}
	return nil
}
