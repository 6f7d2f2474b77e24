package registry

import (
	"context"
	"net"
	"net/http"

	"github.com/containernetworking/plugins/pkg/ns"
)

// inNetNS runs fn in the network namespace at path, or where the caller is when path is empty. A
// socket keeps the namespace it was made in, so connections and listeners made by fn work from
// anywhere afterwards.
func inNetNS(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	return ns.WithNetNSPath(path, func(ns.NetNS) error { return fn() })
}

// netnsTransport is an HTTP transport whose connections are made in the namespace at path.
func netnsTransport(path string) http.RoundTripper {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := inNetNS(path, func() error {
			var err error
			conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
	return t
}

// listen opens a TCP listener on a free loopback port in the namespace at path.
func listen(path string) (net.Listener, error) {
	var l net.Listener
	err := inNetNS(path, func() error {
		var err error
		l, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	})
	return l, err
}
