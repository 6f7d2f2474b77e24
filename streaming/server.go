package streaming

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"

	"k8s.io/cri-streaming/pkg/streaming"
)

// Server serves the kubelet's exec, attach and port-forward streams at the URLs the CRI's Exec,
// Attach and PortForward return.
type Server struct {
	streaming.Server
	http     *http.Server
	listener net.Listener
}

// NewServer listens on addr (host:port; port 0 picks a free one, whose URL the server then hands
// out) and serves rt's streams there, over SPDY and WebSocket.
func NewServer(addr string, rt streaming.Runtime) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for streams on %s: %w", addr, err)
	}
	cfg := streaming.DefaultConfig
	cfg.Addr = ln.Addr().String()
	cfg.BaseURL = &url.URL{Scheme: "http", Host: ln.Addr().String()}
	srv, err := streaming.NewServer(cfg, rt)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("create stream server: %w", err)
	}
	return &Server{Server: srv, listener: ln, http: &http.Server{Handler: srv, ReadHeaderTimeout: 30 * time.Second}}, nil
}

// Addr is where the server listens.
func (s *Server) Addr() string { return s.listener.Addr().String() }

// Serve serves until Close.
func (s *Server) Serve() error {
	if err := s.http.Serve(s.listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Close stops serving; streams in flight end.
func (s *Server) Close() error { return s.http.Close() }
