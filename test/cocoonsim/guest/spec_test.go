package guest

import (
	"strings"
	"testing"
)

const testAuthorizedKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL2C3FuoQG8R0oRvmgF0YXt37dTd+Osn3bjLFq88howp test"

func TestSpecValidation(t *testing.T) {
	for _, tc := range []struct {
		json string
		err  string // what the error says; "" when valid
	}{
		{`{"http_port":80,"ssh_authorized_key":"` + testAuthorizedKey + `"}`, ""},
		{`{"http_port":22}`, ""},
		{`{"http_port":22,"ssh_authorized_key":"` + testAuthorizedKey + `"}`, "http_port 22 is sshd's port"},
		{`{"http_port":8080}`, "http_port 8080 is the guest's probe port"},
		{`{"http_port":70000}`, "http_port 70000 is not a TCP port"},
		{`{"ssh_authorized_key":"not a key"}`, "ssh_authorized_key: ssh: no key found"},
	} {
		_, err := ParseSpec([]byte(tc.json))
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.json, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error %v, want one saying %q", tc.json, err, tc.err)
		}
	}
}
