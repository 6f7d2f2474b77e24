package guest

import "unicode/utf8"

// Control characters a cooked-mode tty acts on.
const (
	ctrlC     = 0x03
	backspace = 0x08
	ctrlU     = 0x15
	del       = 0x7f
)

// cookedTTY is the guest console's line discipline in canonical ("cooked") mode, reduced to what
// someone typing at it notices: characters are echoed, backspace or DEL erases the last one,
// Ctrl-U the whole line, Ctrl-C abandons it, and Enter (CR, LF or CRLF) finishes it. Other
// control characters are ignored.
type cookedTTY struct {
	line    []byte
	afterCR bool // a LF right after a CR is the same Enter
}

// feed takes typed input, writes the echo to echo and hands every finished line to finished,
// in the order a terminal shows them.
func (t *cookedTTY) feed(input []byte, echo func([]byte), finished func(line string)) {
	var out []byte
	for _, b := range input {
		afterCR := t.afterCR
		t.afterCR = b == '\r'
		switch {
		case b == '\n' && afterCR:
		case b == '\r' || b == '\n':
			echo(append(out, '\r', '\n'))
			out = nil
			line := string(t.line)
			t.line = t.line[:0]
			finished(line)
		case b == backspace || b == del:
			if len(t.line) > 0 {
				_, size := utf8.DecodeLastRune(t.line)
				t.line = t.line[:len(t.line)-size]
				out = append(out, '\b', ' ', '\b')
			}
		case b == ctrlU:
			for range utf8.RuneCount(t.line) {
				out = append(out, '\b', ' ', '\b')
			}
			t.line = t.line[:0]
		case b == ctrlC:
			out = append(out, '^', 'C', '\r', '\n')
			t.line = t.line[:0]
		case b < ' ' && b != '\t':
		default:
			t.line = append(t.line, b)
			out = append(out, b)
		}
	}
	if len(out) > 0 {
		echo(out)
	}
}
