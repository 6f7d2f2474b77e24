package testproc

// TB is the part of testing.TB that the test helpers which start processes (nodes, registries,
// containerd, clusters) use. A *testing.T is one; so is the runner of test/cmd/cocoon-cluster,
// which serves the tests' cluster as a program.
type TB interface {
	Helper()
	Cleanup(func())
	Errorf(format string, args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Failed() bool
	TempDir() string
}
