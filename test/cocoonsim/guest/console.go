package guest

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// consoleQueueLines bounds how much console output waits for a slow or absent reader. A real
// guest's console never stalls the guest; past this bound the simulated one drops output.
const consoleQueueLines = 256

// console is the guest's console device as seen from inside the guest: it prints lines and never
// blocks. A device goroutine moves queued lines to the sink (a PTY or a serial socket), where a
// write may block on a slow or absent reader without holding up the guest. What is typed on the
// device reaches the guest's tty once the guest is up (see typed).
type console struct {
	lines   chan []byte
	pending atomic.Int64 // queued or being written

	accepting atomic.Bool // a simulated guest reads the console
	ttyMu     sync.Mutex
	tty       cookedTTY
}

func newConsole() *console {
	return &console{lines: make(chan []byte, consoleQueueLines)}
}

// run starts the device goroutine that feeds sink. A nil sink discards output, like a console in
// "Off" mode.
func (c *console) run(sink io.Writer) {
	go func() {
		for line := range c.lines {
			if sink != nil {
				_, _ = sink.Write(line)
			}
			c.pending.Add(-1)
		}
	}()
}

// Printf queues one console line (the guest's line ending, "\r\n", is added). It drops the line
// when the queue is full rather than stall the guest.
func (c *console) Printf(format string, args ...any) {
	c.write([]byte(fmt.Sprintf(format, args...) + "\r\n"))
}

// write queues raw console output, dropping it when the queue is full.
func (c *console) write(data []byte) {
	c.pending.Add(1)
	select {
	case c.lines <- data:
	default:
		c.pending.Add(-1)
	}
}

// Flush waits up to timeout for queued lines to reach the sink, so a guest that powers off leaves
// its last words on the console.
func (c *console) Flush(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for c.pending.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}

// acceptInput says whether a simulated guest runs to read the console: before it is up, after
// it stopped, and under a real kernel (which has its own tty), input is dropped here.
func (c *console) acceptInput(on bool) {
	c.accepting.Store(on)
}

// typed is what the device receives from whoever is attached. The simulated guest's tty is in
// cooked mode: it echoes the input, and the guest answers every finished line.
func (c *console) typed(input []byte) {
	if !c.accepting.Load() {
		return
	}
	c.ttyMu.Lock()
	defer c.ttyMu.Unlock()
	c.tty.feed(input, c.write, func(line string) { c.Printf("you typed: %s", line) })
}
