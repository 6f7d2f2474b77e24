package guest

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// session is one running command.
type session struct {
	pgid           int
	stdin          *os.File // write end
	stdout, stderr *os.File // read ends
	exited         <-chan unix.WaitStatus
	done           atomic.Bool // the exit code is going out; nothing is left to kill
}

// start runs the command with a plain environment (PATH, HOME=/root, plus the request's) in /,
// in a new process group.
func (a *agent) start(req execRequest) (*session, error) {
	stdin, stdout, stderr, err := openPipes()
	if err != nil {
		return nil, fmt.Errorf("exec: pipes: %w", err)
	}
	cmd := exec.Command(req.Argv[0], req.Argv[1:]...) //nolint:gosec // running the caller's command is the point
	cmd.Env = commandEnv(req.Env)
	cmd.Dir = "/"
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin.r, stdout.w, stderr.w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	exited, err := a.reaper.start(cmd)
	closeFiles(stdin.r, stdout.w, stderr.w) // the command's ends
	if err != nil {
		closeFiles(stdin.w, stdout.r, stderr.r)
		return nil, fmt.Errorf("exec: start %s: %w", req.Argv[0], err)
	}
	return &session{pgid: cmd.Process.Pid, stdin: stdin.w, stdout: stdout.r, stderr: stderr.r, exited: exited}, nil
}

type pipe struct{ r, w *os.File }

func openPipes() (stdin, stdout, stderr pipe, err error) {
	var pipes [3]pipe
	for i := range pipes {
		if pipes[i].r, pipes[i].w, err = os.Pipe(); err != nil {
			for _, p := range pipes[:i] {
				closeFiles(p.r, p.w)
			}
			return pipe{}, pipe{}, pipe{}, err
		}
	}
	return pipes[0], pipes[1], pipes[2], nil
}

func closeFiles(files ...*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

func commandEnv(extra map[string]string) []string {
	env := map[string]string{"PATH": guestPATH, "HOME": "/root"}
	maps.Copy(env, extra)
	var list []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		list = append(list, k+"="+env[k])
	}
	return list
}

// feedStdin writes the client's input to the command until the client closes it, and then
// keeps reading, only to notice the client going away.
func (s *session) feedStdin(in *bufio.Reader) {
	stdinOpen := true
	closeStdin := func() {
		if stdinOpen {
			_ = s.stdin.Close()
			stdinOpen = false
		}
	}
	defer closeStdin()
	for {
		kind, payload, err := readFrame(in)
		if err != nil {
			s.kill()
			return
		}
		switch kind {
		case frameStdin:
			// A command that stopped reading is not an error (think head -1).
			if stdinOpen {
				if _, err := s.stdin.Write(payload); err != nil {
					closeStdin()
				}
			}
		case frameStdinClose:
			closeStdin()
		}
	}
}

// relay sends one output stream as frames until it ends. If the client stops taking output,
// the command is killed and the rest of its output discarded, so it never blocks on a full pipe.
func (s *session) relay(src *os.File, kind byte, out *frameWriter) {
	defer src.Close() //nolint:errcheck
	buf := make([]byte, outputChunk)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if sendErr := out.send(kind, buf[:n]); sendErr != nil {
				s.kill()
				_, _ = io.Copy(io.Discard, src)
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// kill ends the command's process group, unless the session is already over.
func (s *session) kill() {
	if !s.done.Load() {
		_ = syscall.Kill(-s.pgid, syscall.SIGKILL)
	}
}
