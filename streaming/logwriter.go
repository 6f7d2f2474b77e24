// Package streaming carries a container's streams: its CRI log file, its VM's console, exec into
// the guest, and the server the kubelet's exec, attach and port-forward requests are handed to.
package streaming

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// MaxLogLine is the longest line written as one record; longer lines become partial (P) records,
// as containerd splits them.
const MaxLogLine = 16 << 10

// timestampFormat is the CRI log's: RFC 3339 with nanoseconds, always nine digits.
const timestampFormat = "2006-01-02T15:04:05.000000000Z07:00"

// LogWriter writes a container's output to its CRI log file, one record per line:
// "<timestamp> <stream> <P|F> <line>". Reopen starts a new file at the same path (the kubelet
// renames the file, then asks for a reopen); no line is lost or written twice across it.
//
// A write that fails (a full disk) loses those lines but never fails the writer's caller: the
// container's output must keep flowing to the guest's other readers, and a pipe that errors would
// end the container's process. Failures are counted and logged at most once per logErrorInterval.
type LogWriter struct {
	mu      sync.Mutex
	path    string
	f       *os.File
	partial map[runtimeapi.LogStreamType][]byte
	now     func() time.Time

	log          *slog.Logger
	failed       int
	lastWarnedAt time.Time
	// closed: the container's IO stopped; a reopen racing with it must not open a file nobody
	// closes.
	closed bool
}

// ErrLogClosed: the container's log was closed (its IO stopped).
var ErrLogClosed = errors.New("the container's log is closed: its IO has stopped")

// logErrorInterval paces the warnings about failing log writes.
const logErrorInterval = time.Minute

// OpenLog opens (or creates) the log file at path for appending. Failed writes are reported to log.
func OpenLog(path string, log *slog.Logger) (*LogWriter, error) {
	w := &LogWriter{path: path, partial: map[runtimeapi.LogStreamType][]byte{}, now: time.Now, log: log}
	if err := w.open(); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *LogWriter) open() error {
	if err := os.MkdirAll(filepath.Dir(w.path), 0o755); err != nil {
		return fmt.Errorf("create log dir: %w", err)
	}
	f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("open container log: %w", err)
	}
	w.f = f
	return nil
}

// Stream returns a writer for one stream (stdout or stderr) of the container.
func (w *LogWriter) Stream(stream runtimeapi.LogStreamType) io.Writer {
	return streamWriter{w: w, stream: stream}
}

type streamWriter struct {
	w      *LogWriter
	stream runtimeapi.LogStreamType
}

func (s streamWriter) Write(p []byte) (int, error) {
	if err := s.w.write(s.stream, p); err != nil {
		s.w.writeFailed(err)
	}
	return len(p), nil
}

// writeFailed counts a failed write and warns, at most once per logErrorInterval.
func (w *LogWriter) writeFailed(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.failed++
	if now := w.now(); now.Sub(w.lastWarnedAt) >= logErrorInterval {
		w.lastWarnedAt = now
		w.log.Warn("container output is being lost: its log cannot be written", "path", w.path, "failedWrites", w.failed, "err", err)
	}
}

// FailedWrites is how many writes to the log have failed.
func (w *LogWriter) FailedWrites() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.failed
}

// write records the complete lines of p (and any line that grew past MaxLogLine), keeping the rest
// until its newline arrives. A console's "\r\n" ends a line like "\n".
func (w *LogWriter) write(stream runtimeapi.LogStreamType, p []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	buf := append(w.partial[stream], p...)
	var out bytes.Buffer
	for {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 || i > MaxLogLine {
			break
		}
		w.record(&out, stream, runtimeapi.LogTagFull, bytes.TrimSuffix(buf[:i], []byte("\r")))
		buf = buf[i+1:]
	}
	for len(buf) >= MaxLogLine && bytes.IndexByte(buf[:MaxLogLine], '\n') < 0 {
		w.record(&out, stream, runtimeapi.LogTagPartial, buf[:MaxLogLine])
		buf = buf[MaxLogLine:]
	}
	w.partial[stream] = append([]byte(nil), buf...)
	return w.flush(&out)
}

func (w *LogWriter) record(out *bytes.Buffer, stream runtimeapi.LogStreamType, tag runtimeapi.LogTag, line []byte) {
	out.WriteString(w.now().UTC().Format(timestampFormat))
	out.WriteByte(' ')
	out.WriteString(string(stream))
	out.WriteByte(' ')
	out.WriteString(string(tag))
	out.WriteByte(' ')
	out.Write(line)
	out.WriteByte('\n')
}

func (w *LogWriter) flush(out *bytes.Buffer) error {
	if out.Len() == 0 || w.f == nil {
		return nil
	}
	if _, err := w.f.Write(out.Bytes()); err != nil {
		return fmt.Errorf("write container log: %w", err)
	}
	return nil
}

// Reopen closes the file and opens the path again: after the kubelet renamed the old file, new
// lines go to a new one. A line in the middle of being written ends up whole in the new file.
func (w *LogWriter) Reopen() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrLogClosed
	}
	if w.f != nil {
		_ = w.f.Close()
		w.f = nil
	}
	return w.open()
}

// Close writes what is left of unfinished lines as full records and closes the file.
func (w *LogWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	var out bytes.Buffer
	for _, stream := range []runtimeapi.LogStreamType{runtimeapi.Stdout, runtimeapi.Stderr} {
		if rest := w.partial[stream]; len(rest) > 0 {
			w.record(&out, stream, runtimeapi.LogTagFull, rest)
			delete(w.partial, stream)
		}
	}
	err := w.flush(&out)
	if w.f != nil {
		if cerr := w.f.Close(); err == nil {
			err = cerr
		}
		w.f = nil
	}
	return err
}
