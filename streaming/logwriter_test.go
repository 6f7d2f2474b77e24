package streaming

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/logs"
)

// readBack parses a log file with the kubelet's own reader (the kubectl logs path).
func readBack(t *testing.T, path string) (stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := logs.ReadLogs(context.Background(), path, "", &logs.LogOptions{}, nil, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String()
}

var recordFormat = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z (stdout|stderr) (P|F) `)

func TestLogRecordsAreWhatTheKubeletReads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pod", "ctr", "0.log")
	w, err := OpenLog(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	stdout, stderr := w.Stream(runtimeapi.Stdout), w.Stream(runtimeapi.Stderr)
	fmt.Fprint(stdout, "booting\r\nhalf a ")
	fmt.Fprint(stderr, "an error\n")
	fmt.Fprint(stdout, "line\nlast without newline")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if !recordFormat.MatchString(line) {
			t.Fatalf("record %q is not in the CRI log format", line)
		}
	}
	out, errOut := readBack(t, path)
	if out != "booting\nhalf a line\nlast without newline\n" || errOut != "an error\n" {
		t.Fatalf("read back stdout %q stderr %q", out, errOut)
	}
}

func TestLongLinesBecomePartialRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.log")
	w, err := OpenLog(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 2*MaxLogLine+100)
	fmt.Fprint(w.Stream(runtimeapi.Stdout), long+"\n")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	tags := regexp.MustCompile(`stdout (P|F) `).FindAllStringSubmatch(string(data), -1)
	if len(tags) != 3 || tags[0][1] != "P" || tags[1][1] != "P" || tags[2][1] != "F" {
		t.Fatalf("tags %v, want P P F", tags)
	}
	if out, _ := readBack(t, path); out != long+"\n" {
		t.Fatalf("the long line came back with %d bytes, want %d", len(out), len(long)+1)
	}
}

// TestRotationUnderContinuousOutputLosesAndDoublesNothing renames and reopens the log the way the
// kubelet rotates it, again and again, while output keeps coming, some of it in pieces.
func TestRotationUnderContinuousOutputLosesAndDoublesNothing(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "0.log")
	w, err := OpenLog(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	const lines = 20000
	var wg sync.WaitGroup
	wg.Go(func() {
		out := w.Stream(runtimeapi.Stdout)
		for i := range lines {
			line := fmt.Sprintf("line %d\n", i)
			// Split some lines across writes, as a console delivers them.
			if i%3 == 0 {
				fmt.Fprint(out, line[:4])
				fmt.Fprint(out, line[4:])
			} else {
				fmt.Fprint(out, line)
			}
		}
	})
	rotations := 0
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
			rotations++
			if err := os.Rename(path, filepath.Join(dir, fmt.Sprintf("0.log.%06d", rotations))); err != nil {
				t.Fatal(err)
			}
			if err := w.Reopen(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "0.log*"))
	seen := make([]int, lines)
	for _, f := range files {
		out, _ := readBack(t, f)
		for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
			if l == "" {
				continue
			}
			n, err := strconv.Atoi(strings.TrimPrefix(l, "line "))
			if err != nil {
				t.Fatalf("%s: a torn line %q", f, l)
			}
			seen[n]++
		}
	}
	for i, n := range seen {
		if n != 1 {
			t.Fatalf("line %d appears %d times (over %d rotations into %d files)", i, n, rotations, len(files))
		}
	}
	t.Logf("%d lines, %d rotations", lines, rotations)
}

// A log that cannot be written (a full disk: /dev/full answers every write with ENOSPC) loses
// lines but never fails its writer, so the container's output keeps reaching its other readers
// (an io.MultiWriter stops at the first error, and the main process's pipe with it); the failures
// are counted, and warned about once per interval, not once per line.
func TestFullDiskLosesLinesNotTheContainer(t *testing.T) {
	var warnings bytes.Buffer
	w, err := OpenLog("/dev/full", slog.New(slog.NewTextHandler(&warnings, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var attached bytes.Buffer
	out := io.MultiWriter(w.Stream(runtimeapi.Stdout), &attached)
	for i := range 100 {
		if n, err := fmt.Fprintf(out, "line %d\n", i); err != nil || n == 0 {
			t.Fatalf("write %d: %d, %v", i, n, err)
		}
	}
	if !strings.Contains(attached.String(), "line 99\n") {
		t.Fatalf("the attached reader lost output: %q", attached.String())
	}
	if got := w.FailedWrites(); got != 100 {
		t.Fatalf("%d failed writes counted, want 100", got)
	}
	if n := strings.Count(warnings.String(), "container output is being lost"); n != 1 {
		t.Fatalf("%d warnings for 100 failed writes, want 1:\n%s", n, warnings.String())
	}
}

// A reopen that comes after the container's IO stopped (ReopenContainerLog racing with
// StopContainer) opens nothing: no file is left open that nobody will close.
func TestReopenAfterCloseOpensNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.log")
	w, err := OpenLog(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := w.Reopen(); !errors.Is(err, ErrLogClosed) {
		t.Fatalf("reopen after close: %v, want ErrLogClosed", err)
	}
	if w.f != nil {
		t.Fatal("reopen after close left a file open")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("reopen after close made a new log file: %v", err)
	}
}
