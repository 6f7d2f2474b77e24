package registry

import (
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path"
	"strings"
	"sync"
	"testing"
)

// FaultKind is how a blob download breaks.
type FaultKind int

const (
	// Stall stops sending after the first bytes, until the client gives up.
	Stall FaultKind = iota + 1
	// Cut closes the connection after the first bytes.
	Cut
	// Corrupt flips one byte.
	Corrupt
)

// Fault breaks the download of one blob.
type Fault struct {
	Kind FaultKind
	// After is how many bytes pass unharmed: the stall or cut comes after them, the corrupt byte
	// is the next one.
	After int64
}

// Proxy forwards to a registry and breaks the downloads of chosen blobs.
type Proxy struct {
	// Host is its address, 127.0.0.1:<port>, in the namespace it serves in.
	Host string

	mu       sync.Mutex
	faults   map[string]Fault
	requests map[string]int
	stalls   chan string
}

// StartProxy serves a proxy to upstream in the network namespace at netns (empty: the caller's)
// until the test ends.
func StartProxy(t testing.TB, upstream Target, netns string) *Proxy {
	t.Helper()
	l, err := listen(netns)
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Host: l.Addr().String(), faults: map[string]Fault{}, requests: map[string]int{}, stalls: make(chan string, 16)}
	target := &url.URL{Scheme: "http", Host: upstream.Host}
	rp := &httputil.ReverseProxy{
		Rewrite:        func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport:      upstream.Transport,
		FlushInterval:  -1, // every byte goes on at once, so a stall comes exactly after After bytes
		ModifyResponse: p.breakBlob,
		ErrorLog:       log.New(io.Discard, "", 0),
	}
	srv := &http.Server{Handler: rp} //nolint:gosec // a test server on loopback
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return p
}

// Break makes every later download of the blob (a "sha256:..." digest) fail as fault says.
func (p *Proxy) Break(digest string, fault Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults[digest] = fault
}

// Heal undoes every Break.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.faults)
}

// BlobRequests is how many times the blob's download was asked for.
func (p *Proxy) BlobRequests(digest string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests[digest]
}

// Stalls receives the digest of each download as it stalls.
func (p *Proxy) Stalls() <-chan string { return p.stalls }

func (p *Proxy) breakBlob(resp *http.Response) error {
	req := resp.Request
	if req.Method != http.MethodGet || !strings.Contains(req.URL.Path, "/blobs/") || resp.StatusCode != http.StatusOK {
		return nil
	}
	digest := path.Base(req.URL.Path)
	p.mu.Lock()
	p.requests[digest]++
	fault, ok := p.faults[digest]
	p.mu.Unlock()
	if ok {
		resp.Body = &brokenBody{ReadCloser: resp.Body, fault: fault, req: req, digest: digest, stalls: p.stalls}
	}
	return nil
}

var errCut = errors.New("registry proxy: connection cut")

// brokenBody passes fault.After bytes, then breaks.
type brokenBody struct {
	io.ReadCloser
	fault  Fault
	req    *http.Request
	digest string
	stalls chan<- string
	pos    int64
}

func (b *brokenBody) Read(buf []byte) (int, error) {
	if b.pos >= b.fault.After {
		switch b.fault.Kind {
		case Stall:
			select {
			case b.stalls <- b.digest:
			default:
			}
			<-b.req.Context().Done()
			return 0, b.req.Context().Err()
		case Cut:
			return 0, errCut
		}
	}
	if b.fault.Kind != Corrupt && int64(len(buf)) > b.fault.After-b.pos {
		buf = buf[:b.fault.After-b.pos]
	}
	n, err := b.ReadCloser.Read(buf)
	if b.fault.Kind == Corrupt && b.pos <= b.fault.After && b.fault.After < b.pos+int64(n) {
		buf[b.fault.After-b.pos] ^= 0xff
	}
	b.pos += int64(n)
	return n, err
}
