package cocoonsim_test

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
)

func TestVersionBlock(t *testing.T) {
	s := newSim(t)
	for env, version := range map[string]string{"": `v0\.5\.1`, "0.3.8": `v0\.3\.8`, "0.5.1": `v0\.5\.1`, "v0.5.1": `v0\.5\.1`} {
		r := s.cocoonIn([]string{cocoonsim.VersionEnv + "=" + env}, nil, "version")
		want := regexp.MustCompile(`^Version: +` + version + `\nGit hash: +\S+\nBuilt: +\S+\nGolang version: +go\S+\nOS/Arch: +` + runtime.GOOS + "/" + runtime.GOARCH + "\n$")
		if r.code != 0 || !want.MatchString(r.stdout) {
			t.Fatalf("%s=%q: version output:\n%s", cocoonsim.VersionEnv, env, r.stdout)
		}
	}
	if r := s.cocoonIn([]string{cocoonsim.VersionEnv + "=0.4.0"}, nil, "version"); r.code != 1 || !strings.Contains(r.stderr, "plays cocoon 0.3.8 or 0.5.1") {
		t.Fatalf("an unknown version: exit %d, %q", r.code, r.stderr)
	}
}

// TestEmptyLists: v0.3.8 answers an empty list in plain text even when asked for JSON; v0.5
// prints [] for vm list -o json.
func TestEmptyLists(t *testing.T) {
	for _, version := range []string{"0.3.8", "0.5.1"} {
		t.Run(version, func(t *testing.T) {
			s := newSimAt(t, version)
			emptyVMs := "No VMs found.\n"
			if version == "0.5.1" {
				emptyVMs = "[]\n"
			}
			for _, tc := range []struct {
				args []string
				want string
			}{
				{[]string{"vm", "list", "-o", "json"}, emptyVMs},
				{[]string{"vm", "ls"}, "No VMs found.\n"},
				{[]string{"image", "list", "--format", "json"}, "No images found.\n"},
				{[]string{"snapshot", "list", "-o", "json"}, "No snapshots found.\n"},
			} {
				if got := s.ok(tc.args...); got != tc.want {
					t.Errorf("%v: got %q, want %q", tc.args, got, tc.want)
				}
			}
		})
	}
}

func TestMissingObjectsFailWithCocoonMessages(t *testing.T) {
	s := newSim(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"vm", "rm", "nosuch"}, "vm nosuch: VM not found"},
		{[]string{"vm", "rm", "--force", "nosuch"}, "vm nosuch: VM not found"},
		{[]string{"vm", "inspect", "nosuch"}, "inspect: vm nosuch: VM not found"},
		{[]string{"vm", "start", "nosuch"}, "vm nosuch: VM not found"},
		{[]string{"vm", "stop", "nosuch"}, "vm nosuch: VM not found"},
		{[]string{"snapshot", "rm", "x"}, `rm: resolve "x": snapshot not found`},
		{[]string{"snapshot", "inspect", "x"}, "inspect: snapshot not found"},
		{[]string{"snapshot", "export", "x", "-o", "-"}, "export: snapshot not found"},
		{[]string{"image", "rm", "x"}, `image "x": not found in any backend`},
		{[]string{"image", "inspect", "x"}, `image "x": not found in any backend`},
		{[]string{"vm", "clone", "--name", "c", "x"}, "inspect snapshot x: snapshot not found"},
		{[]string{"vm", "create", "--nics", "0", "nosuch"}, `image "nosuch" not resolved: oci: image "nosuch" not found for VM cocoon-nosuch; cloudimg: image "nosuch" not found for VM cocoon-nosuch`},
		{[]string{"vm", "list", "--bogus"}, "unknown flag: --bogus"},
	} {
		r := s.fails(tc.want, tc.args...)
		if r.stdout != "" {
			t.Errorf("%v: stdout must stay empty on error, got %q", tc.args, r.stdout)
		}
	}
}

func TestBadDNSFailsEveryCommand(t *testing.T) {
	s := newSim(t)
	s.fails(`config: dns: invalid DNS server address "bad"`, "--dns", "bad", "vm", "list")
	s.fails(`config: dns: invalid DNS server address "nope"`, "--dns", "1.1.1.1;nope", "version")
	r := s.cocoonIn([]string{"COCOON_DNS=8.8.8.8,zzz"}, nil, "image", "list")
	if r.code != 1 || r.errorLine() != `Error: config: dns: invalid DNS server address "zzz"` {
		t.Fatalf("COCOON_DNS: exit %d, %q", r.code, r.errorLine())
	}
}

func TestEnvironmentAndConfigFile(t *testing.T) {
	s := newSim(t)
	// COCOON_ROOT_DIR applies when --root-dir is not given.
	envRoot := filepath.Join(filepath.Dir(s.root), "envroot")
	r := runSim(t, []string{"COCOON_ROOT_DIR=" + envRoot}, nil, "--run-dir", s.run, "--log-dir", s.log, "vm", "list")
	if r.code != 0 {
		t.Fatalf("vm list with COCOON_ROOT_DIR: %s", r.stderr)
	}
	if _, err := os.Stat(filepath.Join(envRoot, "cloudhypervisor", "db")); err != nil {
		t.Fatalf("COCOON_ROOT_DIR not used: %v", err)
	}
	// COCOON_LOG_LEVEL is ignored by cocoon (nested key); --log-level is validated.
	if r := s.cocoonIn([]string{"COCOON_LOG_LEVEL=bogus"}, nil, "vm", "list"); r.code != 0 {
		t.Fatalf("COCOON_LOG_LEVEL must be ignored, got %s", r.stderr)
	}
	s.fails("Unknown Level String: 'bogus', defaulting to NoLevel", "--log-level", "bogus", "vm", "list")

	// log.usejson switches stderr to JSON lines.
	cfg := filepath.Join(filepath.Dir(s.root), "cocoon.yaml")
	if err := os.WriteFile(cfg, []byte("log:\n  usejson: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = s.cocoonIn(nil, strings.NewReader("x"), "--config", cfg, "snapshot", "import")
	if r.code != 1 || !strings.Contains(r.stderr, `{"level":"info","func":"cmd.snapshot.import","time":`) {
		t.Fatalf("usejson log line missing: %q", r.stderr)
	}
	s.fails("read config: open /nonexistent.yaml: no such file or directory", "--config", "/nonexistent.yaml", "vm", "list")
}

func TestLogsGoToStderrInColour(t *testing.T) {
	s := newSim(t)
	r := s.cocoonIn(nil, strings.NewReader("not a tar"), "snapshot", "import")
	if r.code != 1 {
		t.Fatalf("garbage import: exit %d", r.code)
	}
	if !strings.Contains(r.stderr, "\x1b[") {
		t.Fatalf("log lines must carry ANSI colour even without a TTY: %q", r.stderr)
	}
	if !regexp.MustCompile(`INF importing from stdin \.\.\. func=cmd\.snapshot\.import`).MatchString(stripANSI(r.stderr)) {
		t.Fatalf("unexpected log line: %q", stripANSI(r.stderr))
	}
}
