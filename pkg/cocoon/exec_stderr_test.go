package cocoon

import (
	"bytes"
	"testing"
)

// TestCocoonErrorFilter: cocoon's last-line failure never reaches the user's stream, whatever the
// chunking; the command's own output does, "Error:" lines of its own and prompts included.
func TestCocoonErrorFilter(t *testing.T) {
	const agentDown = "Error: exec: dial agent: read CONNECT reply: EOF (cocoon-agent may still be starting; retry shortly)\n"
	for _, tc := range []struct {
		name   string
		chunks []string
		want   string
	}{
		{"only cocoon's failure", []string{agentDown}, ""},
		{"cocoon's failure byte by byte", splitBytes(agentDown), ""},
		{"output, then cocoon's failure", []string{"half done\n", agentDown}, "half done\n"},
		{"a prompt without a newline", []string{"$ "}, "$ "},
		{"a prompt, then more", []string{"$ ", "ls\n"}, "$ ls\n"},
		{"the command's own Error: line", []string{"Error: disk full\n"}, "Error: disk full\n"},
		{"a line like cocoon's that is not the last", []string{"Error: exec: mine\n", "more\n"}, "Error: exec: mine\nmore\n"},
		{"a like line, then a prompt", []string{"Error: exec: mine\n", "$ "}, "Error: exec: mine\n$ "},
		{"Error: in the middle of a line", []string{"x ", agentDown}, "x " + agentDown},
		{"an unfinished Err", []string{"Err"}, "Err"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			f := &cocoonErrorFilter{w: &out}
			for _, c := range tc.chunks {
				if n, err := f.Write([]byte(c)); err != nil || n != len(c) {
					t.Fatalf("Write(%q) = %d, %v", c, n, err)
				}
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.want {
				t.Fatalf("passed on %q, want %q", out.String(), tc.want)
			}
		})
	}
}

func splitBytes(s string) []string {
	var out []string
	for i := range len(s) {
		out = append(out, s[i:i+1])
	}
	return out
}
