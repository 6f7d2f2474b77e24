package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func flags() (*pflag.FlagSet, *string, *string, *bool, *int) {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.String("config", "", "")
	socket := fs.String("socket", "/run/default.sock", "")
	state := fs.String("state-dir", "/var/lib/default", "")
	verbose := fs.Bool("serve-default-handler", false, "")
	n := fs.Int("workers", 1, "")
	return fs, socket, state, verbose, n
}

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cfg.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestPrecedenceFlagThenEnvThenFile(t *testing.T) {
	cfg := writeConfig(t, "socket: /run/file.sock\nstate-dir: /var/lib/file\nserve-default-handler: true\nworkers: 3\n")
	fs, socket, state, serve, workers := flags()
	if err := fs.Parse([]string{"--config", cfg, "--socket", "/run/flag.sock"}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TEST_STATE_DIR", "/var/lib/env")
	t.Setenv("TEST_SOCKET", "/run/env.sock")
	if err := Apply(fs, "TEST_", "config"); err != nil {
		t.Fatal(err)
	}
	if *socket != "/run/flag.sock" || *state != "/var/lib/env" || !*serve || *workers != 3 {
		t.Fatalf("socket=%s state=%s serve=%v workers=%d", *socket, *state, *serve, *workers)
	}
}

func TestConfigFileFromEnv(t *testing.T) {
	cfg := writeConfig(t, "state-dir: /var/lib/file\n")
	fs, _, state, _, _ := flags()
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TEST_CONFIG", cfg)
	if err := Apply(fs, "TEST_", "config"); err != nil {
		t.Fatal(err)
	}
	if *state != "/var/lib/file" {
		t.Fatalf("state=%s", *state)
	}
}

func TestDefaultsStayWithoutSources(t *testing.T) {
	fs, socket, _, _, _ := flags()
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := Apply(fs, "NOTSET_", "config"); err != nil {
		t.Fatal(err)
	}
	if *socket != "/run/default.sock" {
		t.Fatalf("socket=%s", *socket)
	}
}

func TestBadValuesAndUnknownKeysAreErrors(t *testing.T) {
	fs, _, _, _, _ := flags()
	_ = fs.Parse([]string{"--config", writeConfig(t, "sockett: /x\n")})
	if err := Apply(fs, "TEST_", "config"); err == nil || !strings.Contains(err.Error(), `unknown setting "sockett"`) {
		t.Fatalf("err = %v", err)
	}
	fs, _, _, _, _ = flags()
	_ = fs.Parse(nil)
	t.Setenv("TEST_WORKERS", "many")
	if err := Apply(fs, "TEST_", "config"); err == nil || !strings.Contains(err.Error(), "TEST_WORKERS") {
		t.Fatalf("err = %v", err)
	}
	fs, _, _, _, _ = flags()
	_ = fs.Parse([]string{"--config", filepath.Join(t.TempDir(), "missing.yaml")})
	if err := Apply(fs, "NOTSET_", "config"); err == nil {
		t.Fatal("a missing config file was accepted")
	}
}
