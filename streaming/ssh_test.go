package streaming

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// A guest sshd that accepts the connection and never speaks does not hold SSHExec past its
// context, and the connection is closed (no goroutine or socket left behind per probe).
func TestSSHExecEndsWithItsContextAgainstAStalledSSHD(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	closed := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			closed <- err
			return
		}
		defer conn.Close()
		// Says nothing; reads until the client hangs up.
		_, err = io.Copy(io.Discard, conn)
		closed <- err
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	result := make(chan error, 1)
	go func() {
		_, err := SSHExec(ctx, SSHTarget{Addr: ln.Addr().String(), User: "root", HostKey: ssh.InsecureIgnoreHostKey()}, []string{"true"}, ExecIO{Stdout: io.Discard, Stderr: io.Discard})
		result <- err
	}()
	select {
	case err := <-result:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("SSHExec against a stalled sshd: %v, want the context's deadline", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("SSHExec still waits for a stalled sshd a minute after its context ended")
	}
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("the connection to the stalled sshd was left open")
	}
}
