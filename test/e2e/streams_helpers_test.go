package e2e

import (
	"context"
	"io"
	"net/url"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/syncio"
)

// kubeletClientConfig reaches cocoon-cri's stream server (plain HTTP) and the test kubelet's API
// (HTTPS with a self-signed certificate made at its start).
var kubeletClientConfig = &rest.Config{TLSClientConfig: rest.TLSClientConfig{Insecure: true}}

// streamResult is what a stream printed.
type streamResult struct {
	stdout, stderr string
	err            error
}

// streamOpts are the streams the request behind a URL asked for, besides stdin and stdout (a
// client must open exactly those: an extra stream stalls the connection, for kubectl as for us),
// and whether to speak WebSocket (the channel protocol v4, which stream servers serve; v5 is
// translated to SPDY by the API server before it reaches a node) instead of SPDY.
type streamOpts struct{ tty, stderr, websocket bool }

// stream opens an exec or attach stream at url the way the kubelet's clients do (SPDY), from the
// node's namespace where the stream server listens, and runs it to its end or ctx's.
func (n *node) stream(ctx context.Context, rawURL string, stdin io.Reader, want streamOpts) streamResult {
	n.t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		n.t.Fatal(err)
	}
	var executor remotecommand.Executor
	if want.websocket {
		executor, err = remotecommand.NewWebSocketExecutorForProtocols(kubeletClientConfig, "GET", rawURL, "v4.channel.k8s.io")
	} else {
		executor, err = remotecommand.NewSPDYExecutor(kubeletClientConfig, "POST", u)
	}
	if err != nil {
		n.t.Fatal(err)
	}
	// The stream's goroutines write these; what a test reads is well under the limit.
	out, errOut := &syncio.Tail{Max: 1 << 20}, &syncio.Tail{Max: 1 << 20}
	opts := remotecommand.StreamOptions{Stdin: stdin, Stdout: out, Tty: want.tty}
	if want.stderr {
		opts.Stderr = errOut
	}
	// The connection is dialled on this goroutine, so from the node's namespace; the goroutines
	// the stream starts only use it.
	nsErr := ns.WithNetNSPath(n.NodeNS, func(ns.NetNS) error {
		err = executor.StreamWithContext(ctx, opts)
		return nil
	})
	if nsErr != nil {
		n.t.Fatal(nsErr)
	}
	return streamResult{stdout: out.String(), stderr: errOut.String(), err: err}
}

// execURL asks cocoon-cri for an exec stream.
func (n *node) execURL(req *runtimeapi.ExecRequest) string {
	n.t.Helper()
	rt, _ := n.clients()
	resp, err := rt.Exec(context.Background(), req)
	if err != nil {
		n.t.Fatal(err)
	}
	return resp.GetUrl()
}

// attachURL asks cocoon-cri for an attach stream.
func (n *node) attachURL(req *runtimeapi.AttachRequest) string {
	n.t.Helper()
	rt, _ := n.clients()
	resp, err := rt.Attach(context.Background(), req)
	if err != nil {
		n.t.Fatal(err)
	}
	return resp.GetUrl()
}

// startContainer creates and starts a container from cfg in a pod.
func (n *node) startContainer(podID, podFile string, cfg *runtimeapi.ContainerConfig) string {
	n.t.Helper()
	ctrID := n.mustCrictl("create", "--no-pull", podID, n.configFile(cfg.GetMetadata().GetName()+".json", cfg), podFile)
	n.mustCrictl("start", ctrID)
	return ctrID
}

// slowReader yields its data, then blocks until ctx ends: a client whose stdin stays open.
type slowReader struct {
	ctx  context.Context
	data []byte
}

func (r *slowReader) Read(p []byte) (int, error) {
	if len(r.data) > 0 {
		n := copy(p, r.data)
		r.data = r.data[n:]
		return n, nil
	}
	<-r.ctx.Done()
	return 0, io.EOF
}

// within gives a stream the time a healthy one needs, generously.
func within() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), time.Minute)
}
