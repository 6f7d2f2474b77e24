package guest

import (
	"net"
	"os"
	"testing"
	"time"
)

func TestAwaitHangupOfAPipeReader(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close() //nolint:errcheck
	_ = r.Close()
	if !AwaitHangup(w, make(chan struct{})) {
		t.Fatal("a pipe whose reader closed is not hung up")
	}
}

func TestAwaitHangupOfASocketPeer(t *testing.T) {
	ours, theirs, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	defer ours.Close() //nolint:errcheck
	_ = theirs.Close()
	if !AwaitHangup(ours, make(chan struct{})) {
		t.Fatal("a socket whose peer closed is not hung up")
	}
}

// Data waiting to be read is no hangup: the wait goes on until told to stop.
func TestAwaitHangupIgnoresDataAndStops(t *testing.T) {
	ours, theirs, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	defer ours.Close()   //nolint:errcheck
	defer theirs.Close() //nolint:errcheck
	if _, err := theirs.Write([]byte("pending")); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	time.AfterFunc(3*hangupCheckInterval, func() { close(stop) })
	if AwaitHangup(ours, stop) {
		t.Fatal("a live peer with data pending counted as hung up")
	}
}

func socketPair() (*net.UnixConn, *net.UnixConn, error) {
	dev, guestEnd, err := newVsockDevice()
	if err != nil {
		return nil, nil, err
	}
	defer guestEnd.Close() //nolint:errcheck
	c, err := net.FileConn(guestEnd)
	if err != nil {
		_ = dev.Close()
		return nil, nil, err
	}
	return dev, c.(*net.UnixConn), nil
}
