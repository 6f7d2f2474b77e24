package vmruntime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/streaming"
)

// A container's command normally runs detached in its guest (docs/streaming.md, "Main
// processes"): a shell started apart with setsid runs it with its output on two named pipes in
// guestMainDir, and records its PID and, when it ends, its exit status there. The session
// cocoon-cri follows it with only reads those pipes. A hibernation stops that session and the wake
// starts another, and so does a restart of cocoon-cri: the command itself runs on, and what it
// writes meanwhile waits in the pipes (64 KiB of it; then the command waits too). A guest restored
// from a checkpoint, or forked, has the command of the VM it copies running already: it is followed
// instead of launched again. A command with a terminal or stdin runs in the session itself, as does
// one whose guest lacks setsid or mkfifo, or is Windows: it is cut by a restart, and never
// hibernates.
const (
	guestMainRoot = "/run/cocoon-cri"
	// guestMainDir holds the VM's one container's command: the same in every VM, so that a copy
	// of a VM finds the command it copied.
	guestMainDir = guestMainRoot + "/main"
)

// detachable says whether a container's command may run detached.
func detachable(c *store.Container) bool {
	cfg := c.Config.Msg
	return !cfg.GetTty() && !cfg.GetStdin() && !c.VM.Windows
}

// guestFunctions are the shell functions the scripts share, for the command's directory $1:
//   - runs says whether the command recorded there runs. The wrapper records its PID with its
//     start (proc(5) stat field 22), so that another process given the PID later, in a guest that
//     came back without the command, is not taken for it.
//   - readers starts the readers of the pipes ($o and $e).
//   - follow waits until the command has ended and its output is read. The wrapper keeps the pipes
//     open after the command's end until a follower says, through the pipe done, that its readers
//     hold them: what the command wrote last waits in the pipes for them, also when it ended while
//     nobody followed. The readers' and the sayer's PIDs are kept, for the next follower to end
//     them: a session cut short by a restart may leave them behind.
const guestFunctions = `started() { s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; set -- $s; echo "${20}"; }
runs() { [ -f "$1/pid" ] || return 1; read -r p t <"$1/pid"; [ -n "$p" ] && [ "$(started "$p")" = "$t" ]; }
readers() { cat "$1/out" & o=$!; cat "$1/err" >&2 & e=$!; echo "$o $e" >"$1/readers"; }
follow() { echo >"$1/done" 2>/dev/null & d=$!; echo "$o $e $d" >"$1/readers"; wait $o $e; kill $d 2>/dev/null; return 0; }
`

// launchScript makes the pipes, starts the readers that pass them on to the session, launches the
// command apart and follows it until it has ended. Its $0 is the command's directory, its
// arguments the command. It exits at once, launching nothing, when the command runs already (a
// copy of a VM: mainStatus then finds it running, and it is followed) and when the guest cannot run
// the command apart (mainStatus finds no PID). The readers are started first: they wait for the
// wrapper, which opens the pipes read-write, so that they stay open whoever reads them, and says
// it has recorded its PID through the pipe ready.
const launchScript = guestFunctions + `[ ! -f "$0/exit" ] && runs "$0" && exit 0
command -v setsid >/dev/null 2>&1 && command -v mkfifo >/dev/null 2>&1 || exit 0
rm -rf "$0" && mkdir -p "$0" && mkfifo "$0/out" "$0/err" "$0/ready" "$0/done" || exit 0
readers "$0"
setsid /bin/sh -c '(s=$(cat "/proc/$$/stat"); s=${s##*) }; set -- $s; echo "$$ ${20}") >"$0/pid.new" && mv "$0/pid.new" "$0/pid"
echo >"$0/ready"
exec 3<>"$0/out" 4<>"$0/err"
"$@" </dev/null >&3 2>&4 3>&- 4>&-
echo $? >"$0/exit.new" && mv "$0/exit.new" "$0/exit"
read -r _ <"$0/done"' "$0" "$@" </dev/null >/dev/null 2>&1 &
read -r _ <"$0/ready"
follow "$0"
`

// followScript follows a command launched earlier, once more: the readers and the sayer of an
// earlier session that may still run are ended, and new ones started. A reader opening its pipe
// while nothing holds it (the wrapper gone) would wait for a writer forever: the script waits
// until both readers hold their pipes, or the wrapper is gone, and in the second case opens each
// pipe for writing itself, for a moment, which lets them through.
const followScript = guestFunctions + `opened() { for f in /proc/$1/fd/*; do [ "$(readlink "$f")" = "$2" ] && return 0; done; return 1; }
for p in $(cat "$0/readers" 2>/dev/null); do kill "$p" 2>/dev/null; done
runs "$0" || exit 0
readers "$0"
until { opened $o "$0/out" && opened $e "$0/err"; } || ! runs "$0"; do sleep 0.05 2>/dev/null || sleep 1; done
runs "$0" || { : 1<>"$0/out"; : 1<>"$0/err"; }
follow "$0"
`

// statusScript says where a detached command stands: "exit N", "running", "lost" (launched, no
// longer running, and no status recorded: the guest restarted, or came back without it) or "none"
// (never launched).
const statusScript = guestFunctions + `if [ -f "$0/exit" ]; then echo "exit $(cat "$0/exit")"
elif [ ! -f "$0/pid" ]; then echo none
elif runs "$0"; then echo running
else echo lost; fi
`

// errMainProcessLost: a detached command was no longer in its guest when cocoon-cri looked.
var errMainProcessLost = errors.New("the command was no longer running in the guest when cocoon-cri looked again, " +
	"and it left no exit status (the guest restarted, or its saved state came back without it)")

// runMain runs a container's command as its main process, detached where it can, and returns its
// exit code; ctx ends it (a stop).
func (s *Runtime) runMain(ctx context.Context, sb *store.Sandbox, c *store.Container, m *mainProcess) (int, error) {
	cmd := containerCommand(c.Config.Msg, m.argv)
	inSession := func() (int, error) {
		return m.run(func(stdio streaming.ExecIO) (int, error) { return s.guest.run(ctx, sb, c, cmd, stdio) })
	}
	if !detachable(c) {
		return inSession()
	}
	dir := guestMainDir
	script := guestCommand{argv: append([]string{"/bin/sh", "-c", launchScript, dir}, cmd.argv...), env: cmd.env, dir: cmd.dir}
	// launching: the session is the launch's, and a command found never launched is one the guest
	// could not launch apart. Afterwards (a re-follow, a restart) there was a command: a guest
	// without it lost it.
	launching := !m.adopted
	if !launching {
		script = systemCommand("/bin/sh", "-c", followScript, dir)
	} else if err := s.recordMainDetached(c.ID, true); err != nil {
		return -1, err
	}
	for {
		followCtx, ended, ok := m.follow.begin(ctx)
		if !ok {
			return -1, ctx.Err()
		}
		_, err := m.run(func(stdio streaming.ExecIO) (int, error) { return s.guest.run(followCtx, sb, c, script, stdio) })
		switch {
		case ctx.Err() != nil:
			ended(true)
			return -1, ctx.Err()
		case followCtx.Err() != nil: // paused for a hibernation
			ended(false)
			launching, script = false, systemCommand("/bin/sh", "-c", followScript, dir)
			continue
		}
		// Still under the gate: a hibernation waits for the answer, and does not begin once the
		// command has ended.
		st, serr := s.mainStatus(ctx, sb, c, dir)
		ended(serr != nil || !st.running)
		switch {
		case serr != nil && err != nil:
			return -1, err
		case serr != nil:
			return -1, serr
		case st.exited:
			return st.code, nil
		case st.lost, st.never && !launching:
			return -1, errMainProcessLost
		case st.never:
			s.log.Info("the guest cannot run the command apart from cocoon-cri's session (no setsid or mkfifo): "+
				"it runs in the session, and neither a hibernation nor a restart of cocoon-cri will keep it", "container", c.ID)
			if err := s.recordMainDetached(c.ID, false); err != nil {
				return -1, err
			}
			return inSession()
		}
		// Still running, its output closed or the session cut: follow it again, after a pause.
		select {
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-time.After(agentRetry):
		}
		launching, script = false, systemCommand("/bin/sh", "-c", followScript, dir)
	}
}

func (s *Runtime) recordMainDetached(containerID string, detached bool) error {
	if _, err := s.store.Containers.Modify(containerID, func(r *store.Container) error {
		r.MainDetached = detached
		return nil
	}); err != nil {
		return fmt.Errorf("record how the command runs: %w", err)
	}
	return nil
}

// mainState is what statusScript found.
type mainState struct {
	exited, running, lost, never bool
	code                         int
}

// mainStatus asks the guest where the detached command in dir stands.
func (s *Runtime) mainStatus(ctx context.Context, sb *store.Sandbox, c *store.Container, dir string) (mainState, error) {
	out := &cappedBuffer{max: 256}
	code, err := s.guest.run(ctx, sb, c, systemCommand("/bin/sh", "-c", statusScript, dir),
		streaming.ExecIO{Stdout: out, Stderr: io.Discard})
	if err == nil && code != 0 {
		err = fmt.Errorf("the status of the command in the guest: the shell exited %d", code)
	}
	if err != nil {
		return mainState{}, err
	}
	answer := strings.TrimSpace(out.String())
	switch {
	case strings.HasPrefix(answer, "exit "):
		code, err := strconv.Atoi(strings.TrimPrefix(answer, "exit "))
		if err != nil {
			return mainState{}, fmt.Errorf("the status of the command in the guest: %q", answer)
		}
		return mainState{exited: true, code: code}, nil
	case answer == "running":
		return mainState{running: true}, nil
	case answer == "lost":
		return mainState{lost: true}, nil
	case answer == "none":
		return mainState{never: true}, nil
	}
	return mainState{}, fmt.Errorf("the status of the command in the guest: %q", answer)
}

// followGate lets a hibernation end the session that follows a detached command, and the wake
// start the next one.
type followGate struct {
	mu       sync.Mutex
	paused   chan struct{} // closed on resume; nil while following may go on
	cancel   context.CancelFunc
	ended    chan struct{}
	finished bool // the command has ended, or no longer runs detached
}

// begin waits while following is paused and returns the context of the next session, and what to
// call when it has ended (and whether the command is finished with); ok is false when ctx ended
// first.
func (g *followGate) begin(ctx context.Context) (followCtx context.Context, ended func(finished bool), ok bool) {
	for {
		g.mu.Lock()
		paused := g.paused
		if paused == nil {
			followCtx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			g.cancel, g.ended = cancel, done
			g.mu.Unlock()
			return followCtx, func(finished bool) {
				cancel()
				g.mu.Lock()
				g.cancel, g.ended, g.finished = nil, nil, finished
				g.mu.Unlock()
				close(done)
			}, true
		}
		g.mu.Unlock()
		select {
		case <-paused:
		case <-ctx.Done():
			return nil, nil, false
		}
	}
}

// pause ends the session that follows, and waits, within ctx, until it has; no other begins until
// resume. It is errNothingToDo once the command has ended.
func (g *followGate) pause(ctx context.Context) error {
	g.mu.Lock()
	if g.paused == nil {
		g.paused = make(chan struct{})
	}
	cancel, ended := g.cancel, g.ended
	g.mu.Unlock()
	if cancel != nil {
		cancel()
		select {
		case <-ended:
		case <-ctx.Done():
			return fmt.Errorf("end the session that follows the command: %w", ctx.Err())
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.finished {
		return errNothingToDo
	}
	return nil
}

// resume lets following go on.
func (g *followGate) resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.paused != nil {
		close(g.paused)
		g.paused = nil
	}
}
