package cocoonsim

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Log levels, numbered like zerolog's.
const (
	levelDebug = 0
	levelInfo  = 1
	levelWarn  = 2
	levelError = 3
	levelNone  = 6
)

var levelNames = map[string]int{
	"debug": levelDebug, "info": levelInfo, "warn": levelWarn, "error": levelError,
	"fatal": 4, "panic": 5, "": levelNone, "disabled": 7, "trace": -1,
}

// ANSI SGR codes zerolog's ConsoleWriter uses.
const (
	ansiBold     = 1
	ansiRed      = 31
	ansiGreen    = 32
	ansiYellow   = 33
	ansiCyan     = 36
	ansiDarkGray = 90
)

// logger writes cocoon's log lines: zerolog console format on stderr, coloured whether or not
// stderr is a terminal (only NO_COLOR turns colour off), or one JSON object per line when the
// config says log.usejson (or names a log.filename, which zerolog always writes as JSON).
type logger struct {
	mu      sync.Mutex
	w       io.Writer
	json    bool
	level   int
	noColor bool
}

func newLogger(conf LogConfig, stderr io.Writer) (*logger, error) {
	level, ok := levelNames[strings.ToLower(conf.Level)]
	if !ok {
		//lint:ignore ST1005 zerolog's exact text, which cocoon prints
		return nil, fmt.Errorf("Unknown Level String: '%s', defaulting to NoLevel", conf.Level)
	}
	l := &logger{w: stderr, json: conf.UseJSON, level: level, noColor: os.Getenv("NO_COLOR") != ""}
	if conf.Filename != "" {
		f, err := os.OpenFile(conf.Filename, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return nil, fmt.Errorf("open log file: %w", err)
		}
		l.w, l.json = f, true
	}
	return l, nil
}

// funcLogger is cocoon's log.WithFunc: every line carries func=<name>.
type funcLogger struct {
	l  *logger
	fn string
}

func (l *logger) with(fn string) funcLogger { return funcLogger{l: l, fn: fn} }

func (f funcLogger) Infof(format string, args ...any) { f.l.write(levelInfo, f.fn, format, args) }
func (f funcLogger) Warnf(format string, args ...any) { f.l.write(levelWarn, f.fn, format, args) }

func (l *logger) write(level int, fn, format string, args []any) {
	if level < l.level {
		return
	}
	msg := fmt.Sprintf(format, args...)
	now := time.Now()
	var line string
	if l.json {
		// Field order as cocoon's zerolog setup emits it.
		b, _ := json.Marshal(struct {
			Level   string `json:"level"`
			Func    string `json:"func"`
			Time    string `json:"time"`
			Message string `json:"message"`
		}{levelWord(level), fn, now.Format(time.RFC3339), msg})
		line = string(b)
	} else {
		msgColor := 0 // zerolog bolds the message from info up
		if level >= levelInfo {
			msgColor = ansiBold
		}
		line = fmt.Sprintf("%s %s %s %s%s",
			l.colorize(now.Format(time.RFC822), ansiDarkGray),
			l.colorize(levelTag(level), levelColor(level)),
			l.colorize(msg, msgColor),
			l.colorize("func=", ansiCyan), fn)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = fmt.Fprintln(l.w, line)
}

func (l *logger) colorize(s string, code int) string {
	if l.noColor || code == 0 {
		return s
	}
	return fmt.Sprintf("\x1b[%dm%s\x1b[0m", code, s)
}

func levelWord(level int) string {
	return map[int]string{levelDebug: "debug", levelInfo: "info", levelWarn: "warn", levelError: "error"}[level]
}

func levelTag(level int) string {
	return map[int]string{levelDebug: "DBG", levelInfo: "INF", levelWarn: "WRN", levelError: "ERR"}[level]
}

func levelColor(level int) int {
	return map[int]int{levelDebug: 0, levelInfo: ansiGreen, levelWarn: ansiYellow, levelError: ansiRed}[level]
}
