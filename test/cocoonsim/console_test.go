package cocoonsim_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// The guest's console is a tty in cooked mode: what is typed is echoed, backspace erases, and
// every line reaches the guest, which answers it.
func TestConsoleInputReachesTheGuest(t *testing.T) {
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "oci"})
	s.importSnapshot(testimage.SnapshotOptions{Name: "uefi", ImageType: cocoon.ImageTypeCloudImg, Image: "https://example.invalid/cloud.qcow2"})

	t.Run("pty", func(t *testing.T) {
		vm := s.in(t).clone("oci", "pty-vm")
		file := vmInfo(t, vm.SocketPath)["config"].(map[string]any)["console"].(map[string]any)["file"].(string)
		pty, err := os.OpenFile(file, os.O_RDWR|syscall.O_NOCTTY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer pty.Close() //nolint:errcheck
		checkConsoleEcho(t, pty, "cocoon-sim guest pty-vm ready")
	})
	t.Run("serial socket", func(t *testing.T) {
		vm := s.in(t).clone("uefi", "serial-vm")
		conn, err := net.Dial("unix", filepath.Join(s.run, "cloudhypervisor", vm.ID, "console.sock"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close() //nolint:errcheck
		checkConsoleEcho(t, conn.(*net.UnixConn), "cocoon-sim guest serial-vm ready")
	})
}

type consoleConn interface {
	Write([]byte) (int, error)
	Read([]byte) (int, error)
	SetReadDeadline(t time.Time) error
}

func checkConsoleEcho(t *testing.T, console consoleConn, ready string) {
	t.Helper()
	readUntil(t, console, ready)
	if _, err := console.Write([]byte("hello world\r")); err != nil {
		t.Fatal(err)
	}
	if got := readUntil(t, console, "you typed: hello world\r\n"); !strings.HasSuffix(got, "hello world\r\nyou typed: hello world\r\n") {
		t.Fatalf("console after a line: %q", got)
	}
	if _, err := console.Write([]byte("lsx\x7f -l\n")); err != nil {
		t.Fatal(err)
	}
	if got := readUntil(t, console, "you typed: ls -l\r\n"); !strings.HasSuffix(got, "lsx\b \b -l\r\nyou typed: ls -l\r\n") {
		t.Fatalf("console after an erase: %q", got)
	}
}
