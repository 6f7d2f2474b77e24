package guest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// AgentPort is the vsock port cocoon-agent listens on inside the guest (cocoon's
// hypervisor.VsockAgentPort).
const AgentPort = 1024

// guestPATH is the PATH of the guest OS, and of every command the agent starts.
const guestPATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// agent stands in for cocoon-agent: every connection runs one command inside the guest, as a
// child of the guest OS (so in the guest's namespaces), with its own process group.
type agent struct {
	reaper *reaper
}

// serve runs one exec session: the request, the command with its three streams relayed as
// frames, then its exit code. A client that goes away (its connection closes, or stops taking
// output) takes the command's whole process group with it.
func (a *agent) serve(conn net.Conn) {
	defer conn.Close() //nolint:errcheck
	in := bufio.NewReader(conn)
	out := &frameWriter{w: conn}
	kind, payload, err := readFrame(in)
	if err != nil {
		_ = out.send(frameError, fmt.Appendf(nil, "read request: %v", err))
		return
	}
	if kind == frameReseed {
		if err := reseed(payload); err != nil {
			_ = out.send(frameError, []byte(err.Error()))
			return
		}
		_ = out.sendExit(0)
		return
	}
	req, err := decodeExecRequest(kind, payload)
	if err != nil {
		_ = out.send(frameError, []byte(err.Error()))
		return
	}
	if filepath.Base(req.Argv[0]) == "poweroff" {
		// The guest's init takes the request: the command answers, then the whole guest goes down
		// with its init, and the hypervisor sees a guest that powered off.
		_ = out.sendExit(0)
		_ = conn.Close()
		os.Exit(0)
	}
	s, err := a.start(req)
	if err != nil {
		_ = out.send(frameError, []byte(err.Error()))
		return
	}
	go s.feedStdin(in)
	// A client may vanish while nothing flows (a silent command, or stdin held up by a command
	// that does not read it): its hangup alone ends the command.
	if peer, ok := conn.(syscall.Conn); ok {
		sessionOver := make(chan struct{})
		defer close(sessionOver)
		go func() {
			if AwaitHangup(peer, sessionOver) {
				s.kill()
			}
		}()
	}
	var relays sync.WaitGroup
	relays.Go(func() { s.relay(s.stdout, frameStdout, out) })
	relays.Go(func() { s.relay(s.stderr, frameStderr, out) })
	status := <-s.exited
	// The output ends when every holder of the pipes is gone: the command and whatever it left
	// running in the background with them.
	relays.Wait()
	s.done.Store(true)
	_ = out.sendExit(exitCode(status))
}

// reseed stands in for cocoon-agent's: the entropy would go to the guest kernel's pool (the
// simulated guest has no kernel of its own), and a new machine-id replaces /etc/machine-id in
// place, since the guest's file is a bind mount.
func reseed(payload []byte) error {
	var req reseedRequest
	if err := json.Unmarshal(payload, &req); err != nil {
		return fmt.Errorf("decode reseed request: %w", err)
	}
	if len(req.Entropy) == 0 {
		return errors.New("reseed: no entropy")
	}
	if !req.MachineID {
		return nil
	}
	id, err := newMachineID()
	if err != nil {
		return err
	}
	if err := os.WriteFile("/etc/machine-id", []byte(id+"\n"), 0o444); err != nil { //nolint:gosec // world-readable, as systemd writes it
		return fmt.Errorf("reseed: write machine-id: %w", err)
	}
	return nil
}

func decodeExecRequest(kind byte, payload []byte) (execRequest, error) {
	if kind != frameExec {
		return execRequest{}, fmt.Errorf("expected an exec request, got frame %q", kind)
	}
	var req execRequest
	if err := json.Unmarshal(payload, &req); err != nil {
		return execRequest{}, fmt.Errorf("decode exec request: %w", err)
	}
	if len(req.Argv) == 0 {
		return execRequest{}, errors.New("exec: argv is empty")
	}
	return req, nil
}
