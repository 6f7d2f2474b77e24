package cocoon

import (
	"bytes"
	"io"
	"strings"
)

// cocoonErrorFilter passes a command's stderr on to the caller, except cocoon's own failure line
// ("Error: exec: ..."), which cocoon prints last on the same stream when the command could not be
// run: the caller gets that as an error instead, and the user's stream does not show the retries
// of a guest whose agent is still starting. A line that looks like cocoon's is held until more
// output follows it (then it was the command's) or the stream ends. Everything else goes on at
// once, prompts without a newline included.
type cocoonErrorFilter struct {
	w       io.Writer
	held    []byte // a complete line that may be cocoon's failure
	pending []byte // the start of a line that may become one
	midLine bool   // the last bytes passed on did not end a line
	err     error  // the first write error of w
}

func (f *cocoonErrorFilter) Write(p []byte) (int, error) {
	data := append(f.pending, p...)
	f.pending = nil
	for len(data) > 0 {
		f.releaseHeld()
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			if !f.midLine && mayBecomeCocoonError(data) {
				f.pending = bytes.Clone(data)
			} else {
				f.pass(data)
				f.midLine = true
			}
			break
		}
		line := data[:i+1]
		data = data[i+1:]
		if !f.midLine && isCocoonErrorLine(line) {
			f.held = bytes.Clone(line)
		} else {
			f.pass(line)
		}
		f.midLine = false
	}
	return len(p), f.err
}

// Close passes on what was held back unless it is cocoon's failure line, and reports the first
// error of the underlying writer.
func (f *cocoonErrorFilter) Close() error {
	if f.held != nil && len(f.pending) > 0 {
		f.releaseHeld()
	}
	rest := f.held
	if rest == nil {
		rest = f.pending
	}
	if rest != nil && !isCocoonErrorLine(rest) {
		f.pass(rest)
	}
	f.held, f.pending = nil, nil
	return f.err
}

func (f *cocoonErrorFilter) releaseHeld() {
	if f.held != nil {
		f.pass(f.held)
		f.held = nil
	}
}

func (f *cocoonErrorFilter) pass(b []byte) {
	if f.err == nil {
		_, f.err = f.w.Write(b)
	}
}

// isCocoonErrorLine reports a line cocoon prints when vm exec itself fails.
func isCocoonErrorLine(line []byte) bool {
	_, ok := cocoonExecError(string(line))
	return ok
}

// mayBecomeCocoonError reports the start of a line that may still turn out to be cocoon's
// failure line, which cobra prints uncolored.
func mayBecomeCocoonError(start []byte) bool {
	const prefix = "Error: "
	s := string(start)
	return strings.HasPrefix(s, prefix) || strings.HasPrefix(prefix, s)
}
