package guest

import (
	"slices"
	"testing"
)

func TestCookedTTY(t *testing.T) {
	for _, tc := range []struct {
		name   string
		inputs []string
		echo   string
		lines  []string
	}{
		{"enter as CR", []string{"ls -l\r"}, "ls -l\r\n", []string{"ls -l"}},
		{"enter as LF", []string{"pwd\n"}, "pwd\r\n", []string{"pwd"}},
		{"CRLF is one enter, also split across reads", []string{"a\r", "\nb\r\n"}, "a\r\nb\r\n", []string{"a", "b"}},
		{"empty line", []string{"\r"}, "\r\n", []string{""}},
		{"backspace and DEL erase", []string{"abx\x7fc\x08d\r"}, "abx\b \bc\b \bd\r\n", []string{"abd"}},
		{"erase on an empty line does nothing", []string{"\x7f\r"}, "\r\n", []string{""}},
		{"erase takes a whole character", []string{"né\x7f\r"}, "né\b \b\r\n", []string{"n"}},
		{"ctrl-U kills the line", []string{"oops\x15ok\r"}, "oops\b \b\b \b\b \b\b \bok\r\n", []string{"ok"}},
		{"ctrl-C abandons the line", []string{"half\x03whole\r"}, "half^C\r\nwhole\r\n", []string{"whole"}},
		{"other control characters are ignored, tab is kept", []string{"a\x1b\tb\x07\r"}, "a\tb\r\n", []string{"a\tb"}},
		{"an unfinished line waits", []string{"partial"}, "partial", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tty cookedTTY
			var echo []byte
			var lines []string
			for _, in := range tc.inputs {
				tty.feed([]byte(in), func(b []byte) { echo = append(echo, b...) }, func(line string) { lines = append(lines, line) })
			}
			if string(echo) != tc.echo || !slices.Equal(lines, tc.lines) {
				t.Fatalf("echo %q, lines %q; want %q, %q", echo, lines, tc.echo, tc.lines)
			}
		})
	}
}

// The echo of a line comes before the guest's answer to it.
func TestCookedTTYEchoesBeforeEachLine(t *testing.T) {
	var tty cookedTTY
	var out []string
	tty.feed([]byte("one\rtwo\r"), func(b []byte) { out = append(out, string(b)) }, func(line string) { out = append(out, "line:"+line) })
	if want := []string{"one\r\n", "line:one", "two\r\n", "line:two"}; !slices.Equal(out, want) {
		t.Fatalf("%q, want %q", out, want)
	}
}
