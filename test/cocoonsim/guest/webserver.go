package guest

import (
	"fmt"
	"html"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"
)

// listenWeb opens the guest's web server port (Spec.HTTPPort) on every address, so it keeps
// answering whatever addresses the guest is given later.
func listenWeb(port int) (net.Listener, error) {
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return nil, fmt.Errorf("listen on http port %d: %w", port, err)
	}
	return ln, nil
}

// serveWeb answers GET / with a small page naming the guest's current hostname and the address
// it was reached at, as a web server image would; other paths are not found.
func serveWeb(ln net.Listener) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		host, _ := os.Hostname()
		local := ""
		if addr, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			local, _, _ = net.SplitHostPort(addr.String())
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = fmt.Fprintf(w, "<!DOCTYPE html>\n<html><head><title>cocoon-sim guest %[1]s</title></head>\n"+
			"<body><h1>cocoon-sim guest %[1]s</h1><p>reached at %[2]s</p></body></html>\n",
			html.EscapeString(host), html.EscapeString(local))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	_ = srv.Serve(ln)
}
