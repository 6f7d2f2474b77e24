package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/cocoonstack/cocoon-cri/pkg/checkpoint"
	"github.com/cocoonstack/cocoon-cri/pkg/config"
	"github.com/cocoonstack/cocoon-cri/test/registry"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// run runs cocoon-cri with args and stdin, and returns what it printed on stdout.
func run(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCommand()
	var stdout, stderr bytes.Buffer
	cmd.SetArgs(args)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	err := cmd.ExecuteContext(context.Background())
	t.Logf("cocoon-cri %s: stderr:\n%s", strings.Join(args, " "), stderr.String())
	return stdout.String(), err
}

func TestImagePush(t *testing.T) {
	// No docker config of the machine's.
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("DOCKER_CONFIG", filepath.Join(home, ".docker"))
	reg := registry.StartInProcess(t, "pusher", "s3cret")
	var archive bytes.Buffer
	if err := testimage.WriteSnapshotArchive(&archive, testimage.SnapshotOptions{Name: "snap"}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "snap.tar")
	if err := os.WriteFile(path, archive.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	ref := reg.Host + "/team/snap:v1"

	// The pushed manifest is the snapshot artifact, under the digest printed.
	out, err := run(t, "", "image", "push", "--creds", "pusher:s3cret", path, ref)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Get(tag, remote.WithAuth(reg.Auth))
	if err != nil {
		t.Fatal(err)
	}
	if want := ref + "@" + desc.Digest.String() + "\n"; out != want {
		t.Fatalf("printed %q, want %q", out, want)
	}
	if desc.ArtifactType != "application/vnd.cocoonstack.snapshot.v1+json" {
		t.Fatalf("artifactType %q", desc.ArtifactType)
	}

	// A password missing from --creds is read from standard input, and --creds comes from the
	// environment too.
	if again, err := run(t, "s3cret\n", "image", "push", "--creds", "pusher", path, reg.Host+"/team/snap:v2"); err != nil || !strings.HasSuffix(again, "@"+desc.Digest.String()+"\n") {
		t.Fatalf("password on stdin: %q, %v", again, err)
	}
	t.Setenv(config.EnvName(envPrefix, "creds"), "pusher:s3cret")
	if _, err := run(t, "", "image", "push", path, reg.Host+"/team/snap:v3"); err != nil {
		t.Fatalf("--creds from the environment: %v", err)
	}
	t.Setenv(config.EnvName(envPrefix, "creds"), "")

	// Refusals: nothing printed, an error that says why.
	podCheckpoint := t.TempDir()
	if err := os.WriteFile(filepath.Join(podCheckpoint, checkpoint.PodFile), []byte(`{"version":1,"containers":[{"name":"app","snapshot":"c1"},{"name":"side","snapshot":"c2"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{path, reg.Host + "/team/snap:v4"}, "authentication"},
		{[]string{filepath.Join(t.TempDir(), "missing.tar"), ref}, "no such file"},
		{[]string{os.Args[0], ref}, "not a cocoon snapshot archive"},
		{[]string{podCheckpoint, ref}, "a whole pod checkpoint; give each container's checkpoint, under a reference of its own: " + filepath.Join(podCheckpoint, "c1") + " (container app)"},
		{[]string{t.TempDir(), ref}, "not a cocoon snapshot directory"},
		{[]string{path, reg.Host + "/Team/Snap"}, "image reference"},
		{[]string{"--registry-insecure", "a/b", path, ref}, "insecure registry"},
		{[]string{"--creds", ":pw", path, ref}, "USER[:PASSWORD]"},
		{[]string{path}, "accepts 2 arg"},
	} {
		out, err := run(t, "", append([]string{"image", "push"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || out != "" {
			t.Errorf("push %v: %q, %v; want an error saying %q", tc.args, out, err, tc.want)
		}
	}
}

// The daemon and image push share the registry flags.
func TestRegistryFlagsAreShared(t *testing.T) {
	root := newRootCommand()
	push, _, err := root.Find([]string{"image", "push"})
	if err != nil {
		t.Fatal(err)
	}
	for _, flag := range []string{"registry-insecure", "registry-ca-file"} {
		d, p := root.Flags().Lookup(flag), push.Flags().Lookup(flag)
		if d == nil || p == nil || d.Usage != p.Usage {
			t.Errorf("--%s: daemon %v, push %v", flag, d, p)
		}
	}
}
