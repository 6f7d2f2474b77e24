package vmruntime

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The argv a guest runs for a container's command, run here by the host's own sh and env, which
// stand in for the guest's: the environment (names a shell would drop included) and the working
// directory reach the command, quoting survives, and a directory that cannot be entered is 128.
func TestContainerCommandRunsWithEnvInDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "work dir", "app")
	cfg := &runtimeapi.ContainerConfig{
		WorkingDir: dir,
		Envs: []*runtimeapi.KeyValue{
			{Key: "GREETING", Value: []byte("hello")},
			{Key: "QUOTED", Value: []byte(`it's "$HOME" ;`)},
			{Key: "dotted.name", Value: []byte("dots")},
			{Key: "GREETING", Value: []byte("hello again")},
		},
	}
	// The command's own shell keeps shell names only, as anywhere: env(1) shows the rest.
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"sh", "-c", `pwd; printf '%s\n' "$GREETING" "$QUOTED"`}, dir + "\nhello again\nit's \"$HOME\" ;\n"},
		{[]string{"env"}, "dotted.name=dots\n"},
	} {
		cmd, want := containerCommand(cfg, tc.argv), tc.want
		if cmd.env["GREETING"] != "hello again" {
			t.Fatalf("a later duplicate does not win: %v", cmd.env)
		}
		// As the SSH path runs it: the whole line through a shell, env(1) last.
		ssh := cmd.sshArgv()
		if out := runArgv(t, ssh, nil); !strings.Contains(out, want) {
			t.Fatalf("ssh argv %q printed %q, want %q", ssh, out, want)
		}
		// As the agent path runs it: vm exec --env sets the environment, a shell stands between
		// (script(1)'s too, for a terminal).
		for _, tty := range []bool{false, true} {
			agent := cmd.agentArgv(tty)
			if out := runArgv(t, agent, cmd.env); !strings.Contains(out, want) {
				t.Fatalf("agent argv %q printed %q, want %q", agent, out, want)
			}
		}
	}

	blocked := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocked, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	bad := guestCommand{argv: []string{"true"}, dir: blocked}
	c := exec.Command(bad.inDir(bad.argv)[0], bad.inDir(bad.argv)[1:]...)
	if err := c.Run(); c.ProcessState == nil || c.ProcessState.ExitCode() != workDirExitCode {
		t.Fatalf("a working directory that is a file: %v", err)
	}
}

// Without a working directory or environment, the command is left as it is.
func TestContainerCommandWithoutSettingsIsUnchanged(t *testing.T) {
	cmd := containerCommand(&runtimeapi.ContainerConfig{}, []string{"uname", "-a"})
	if ssh, agent := cmd.sshArgv(), cmd.agentArgv(false); !slices.Equal(ssh, cmd.argv) || !slices.Equal(agent, cmd.argv) {
		t.Fatalf("argv over SSH %q, through the agent %q", ssh, agent)
	}
	if sys := systemCommand("poweroff"); sys.env != nil || sys.dir != "" {
		t.Fatalf("a system command takes settings: %+v", sys)
	}
}

func runArgv(t *testing.T, argv []string, env map[string]string) string {
	t.Helper()
	c := exec.Command(argv[0], argv[1:]...)
	c.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=/root"}
	for k, v := range env {
		c.Env = append(c.Env, k+"="+v)
	}
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("%q: %v: %s", argv, err, out)
	}
	return strings.ReplaceAll(string(out), "\r", "")
}
