package guest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

const (
	// serialBacklogBytes bounds the output kept for the next client while nobody is connected.
	serialBacklogBytes = 64 << 10
	// serialWriteTimeout drops a client that stops reading instead of stalling the console.
	serialWriteTimeout = 2 * time.Second
)

// serialSocket is the serial port that cloud-hypervisor exposes as a unix socket (console.sock)
// for UEFI (cloud image) VMs. One client is served at a time; output produced while nobody is
// connected is kept (bounded) and replayed to the next client, so a reader that attaches after
// boot still sees the banner.
type serialSocket struct {
	ln    net.Listener
	typed func([]byte) // receives what the client writes

	mu      sync.Mutex
	client  net.Conn
	backlog []byte
}

func listenSerial(path string, typed func([]byte)) (*serialSocket, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale %s: %w", path, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	s := &serialSocket{ln: ln, typed: typed}
	go s.acceptLoop()
	return s, nil
}

func (s *serialSocket) acceptLoop() {
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.client != nil {
			s.mu.Unlock()
			_ = conn.Close() // one session at a time
			continue
		}
		s.client = conn
		backlog := s.backlog
		s.backlog = nil
		if len(backlog) > 0 {
			_ = conn.SetWriteDeadline(time.Now().Add(serialWriteTimeout))
			if _, err := conn.Write(backlog); err != nil {
				s.dropLocked(conn)
			}
		}
		s.mu.Unlock()
		go s.readInput(conn)
	}
}

// readInput passes on what the client types and notices when the client goes away.
func (s *serialSocket) readInput(conn net.Conn) {
	buf := make([]byte, 4096)
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			s.typed(buf[:n])
		}
		if err != nil {
			break
		}
	}
	s.mu.Lock()
	s.dropLocked(conn)
	s.mu.Unlock()
}

func (s *serialSocket) dropLocked(conn net.Conn) {
	if s.client == conn {
		s.client = nil
	}
	_ = conn.Close()
}

// Write sends output to the connected client, or keeps it for the next one.
func (s *serialSocket) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client != nil {
		_ = s.client.SetWriteDeadline(time.Now().Add(serialWriteTimeout))
		if _, err := s.client.Write(b); err == nil {
			return len(b), nil
		}
		s.dropLocked(s.client)
	}
	s.backlog = append(s.backlog, b...)
	if over := len(s.backlog) - serialBacklogBytes; over > 0 {
		s.backlog = s.backlog[over:]
	}
	return len(b), nil
}
