package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestListenReplacesAStaleSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "cri.sock")
	first, err := listenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	// A daemon that died leaves its socket file behind; nobody answers on it.
	first.(*net.UnixListener).SetUnlinkOnClose(false)
	first.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the stale socket is not there to replace: %v", err)
	}
	second, err := listenUnix(path)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	defer second.Close()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != socketMode {
		t.Fatalf("mode %v, want %v", info.Mode().Perm(), os.FileMode(socketMode))
	}
}

func TestListenRefusesASocketInUse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cri.sock")
	live, err := listenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	if _, err := listenUnix(path); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("a second listener on a live socket: %v", err)
	}
}

func TestListenRefusesAFileThatIsNotASocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cri.sock")
	if err := os.WriteFile(path, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := listenUnix(path); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("listen over a regular file: %v", err)
	}
	if data, _ := os.ReadFile(path); string(data) != "precious" {
		t.Fatal("the file was touched")
	}
}
