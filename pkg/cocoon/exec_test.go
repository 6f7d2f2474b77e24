package cocoon

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestVMExecPassesTheCommandsExitCodeOn(t *testing.T) {
	c, dir := fakeCocoon(t,
		response{match: "-- ok", stdout: "out\n"},
		response{match: "-- fails", stdout: "partial\n", stderr: "its own complaint\n", code: 3},
		response{match: "-- says-error", stderr: "Error: the command's own words\n", code: 1},
		response{match: "-- early", stderr: logLine + "Error: exec: dial agent: read CONNECT reply: EOF (cocoon-agent may still be starting; retry shortly)\n", code: 1},
		response{match: "-- stopped", stderr: "Error: exec: vm not running\n", code: 1},
		response{match: "-- old-vm", stderr: "Error: exec: vsock not configured for this VM (recreate the VM to enable agent exec)\n", code: 1},
		response{match: "-- killed", code: 255},
	)
	ctx := context.Background()
	var out, errOut bytes.Buffer
	code, err := c.VMExec(ctx, "VMID", []string{"ok"}, ExecOptions{Stdout: &out, Env: map[string]string{"B": "2", "A": "1"}})
	if err != nil || code != 0 || out.String() != "out\n" {
		t.Fatalf("ok: %d %v %q", code, err, out.String())
	}
	if got := calls(t, dir)[0]; !strings.HasSuffix(got, "vm exec --env A=1 --env B=2 VMID -- ok") {
		t.Fatalf("argv %q", got)
	}
	out.Reset()
	code, err = c.VMExec(ctx, "VMID", []string{"fails"}, ExecOptions{Stdout: &out, Stderr: &errOut})
	if err != nil || code != 3 || out.String() != "partial\n" || errOut.String() != "its own complaint\n" {
		t.Fatalf("fails: %d %v %q %q", code, err, out.String(), errOut.String())
	}
	if code, err = c.VMExec(ctx, "VMID", []string{"says-error"}, ExecOptions{}); err != nil || code != 1 {
		t.Fatalf("a command printing Error: was taken for cocoon failing: %d %v", code, err)
	}
	errOut.Reset()
	if _, err = c.VMExec(ctx, "VMID", []string{"early"}, ExecOptions{Stderr: &errOut}); !errors.Is(err, ErrAgentStarting) {
		t.Fatalf("agent not up: %v", err)
	}
	if strings.Contains(errOut.String(), "Error: exec") {
		t.Fatalf("cocoon's own failure reached the command's stderr: %q", errOut.String())
	}
	if _, err = c.VMExec(ctx, "VMID", []string{"old-vm"}, ExecOptions{}); !errors.Is(err, ErrNoVsock) {
		t.Fatalf("a VM without vsock: %v", err)
	}
	// v0.5 reports a command killed by a signal as exit 255, with no Error: line.
	if code, err = c.VMExec(ctx, "VMID", []string{"killed"}, ExecOptions{}); err != nil || code != 255 {
		t.Fatalf("a signal-killed command: %d %v", code, err)
	}
	var ce *CommandError
	if _, err = c.VMExec(ctx, "VMID", []string{"stopped"}, ExecOptions{}); !errors.As(err, &ce) || ce.Message != "exec: vm not running" {
		t.Fatalf("stopped VM: %v", err)
	}
}

func TestVMExecStdinIsOptIn(t *testing.T) {
	c, dir := fakeCocoon(t, response{match: "vm exec"})
	if _, err := c.VMExec(context.Background(), "VMID", []string{"cat"}, ExecOptions{Stdin: strings.NewReader("typed")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.VMExec(context.Background(), "VMID", []string{"true"}, ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	got := calls(t, dir)
	if !strings.Contains(got[0], "--interactive VMID -- cat") || strings.Contains(got[1], "--interactive") {
		t.Fatalf("argv %q", got)
	}
	if stdin, _ := os.ReadFile(filepath.Join(dir, "stdin.log")); string(stdin) != "typed" {
		t.Fatalf("stdin %q", stdin)
	}
}

func TestVMExecReturnsWhenTheCommandEndsWhileStdinStaysOpen(t *testing.T) {
	// A terminal session: the guest shell exits while the client's stdin stream is still open.
	bin := filepath.Join(t.TempDir(), "cocoon")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nread line\necho \"got $line\"\nexit 4\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := New(Options{Binary: bin, RootDir: "/r", RunDir: "/run/c", LogDir: "/log/c"})
	stdin, typing := io.Pipe()
	defer typing.Close()
	go func() { _, _ = typing.Write([]byte("exit\n")) }()
	type result struct {
		code int
		err  error
	}
	done := make(chan result, 1)
	var out bytes.Buffer
	go func() {
		code, err := c.VMExec(context.Background(), "VMID", []string{"sh"}, ExecOptions{Stdin: stdin, Stdout: &out})
		done <- result{code, err}
	}()
	select {
	case r := <-done:
		if r.err != nil || r.code != 4 || out.String() != "got exit\n" {
			t.Fatalf("%d %v %q", r.code, r.err, out.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("VMExec still waits for a stdin the command no longer reads")
	}
}
