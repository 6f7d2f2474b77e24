package cocoon

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/syncio"
)

// VMEventType is what happened to a VM, as vm status --event names it.
type VMEventType string

// The events of vm status --event. DELETED carries the last record cocoon knew.
const (
	VMAdded    VMEventType = "ADDED"
	VMModified VMEventType = "MODIFIED"
	VMDeleted  VMEventType = "DELETED"
)

// VMEvent is one line of vm status --event --format json: the VM with its reconciled state (a
// record that says running over a dead hypervisor is "stopped (stale)").
type VMEvent struct {
	Event VMEventType `json:"event"`
	VM    VM          `json:"vm"`
}

// WatchVMs runs `vm status --event --format json -n <poll>` and hands every event to fn, in order,
// until cocoon exits or ctx ends. cocoon reports every VM as ADDED first, then changes as it sees
// them: its index files at once, a crashed hypervisor at the next poll. It returns nil when ctx
// ended, and otherwise why the stream stopped.
func (c *Client) WatchVMs(ctx context.Context, poll time.Duration, fn func(VMEvent)) error {
	secs := max(int(poll/time.Second), 1)
	args := []string{"vm", "status", "--event", "--format", "json", "-n", strconv.Itoa(secs)}
	cmd := c.command(ctx, args)
	// The stream lives as long as cocoon-cri: if cocoon-cri is killed, the stream must not stay
	// behind (it has no other reason to end while no VM changes).
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	// The kernel sends that signal when the starting *thread* ends, and the Go runtime ends
	// threads whose goroutine exits locked (the netns set-up does so on purpose). Holding this
	// thread until the stream ends keeps it out of anyone else's hands.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	stderr := &syncio.Tail{Max: maxStderr}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("watch VMs: %w", err)
	}
	if err := cmd.Start(); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("watch VMs: %w", err)
	}
	lines := bufio.NewScanner(stdout)
	lines.Buffer(make([]byte, 64<<10), 4<<20)
	var parseErr error
	for lines.Scan() {
		var ev VMEvent
		if err := json.Unmarshal(lines.Bytes(), &ev); err != nil {
			// A line that is not an event means this cocoon speaks another format: stop rather
			// than guess at VM states.
			parseErr = fmt.Errorf("watch VMs: unexpected line %q: %w", truncate(lines.Text(), 200), err)
			break
		}
		fn(ev)
	}
	if parseErr != nil {
		_ = cmd.Cancel()
	}
	waitErr := cmd.Wait()
	switch {
	case ctx.Err() != nil:
		return nil
	case parseErr != nil:
		return parseErr
	case waitErr != nil:
		return c.commandError(ctx, args, cmd, waitErr, stderr.String())
	}
	return errors.New("watch VMs: cocoon vm status ended")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
