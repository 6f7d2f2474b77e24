package vmstats

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// A cloud-hypervisor's stat line, with a command name that holds what trips naive parsers.
const statFixture = "4242 (cloud-hyper) (v) S 4200 4242 4242 0 -1 4194560 1500 0 7 0 250 125 3 4 20 0 9 0 1351829 1127219200 12000 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0\n"

const statusFixture = `Name:	cloud-hyperviso
Umask:	0022
State:	S (sleeping)
Tgid:	4242
Pid:	4242
PPid:	4200
VmPeak:	 1100800 kB
VmSize:	 1100800 kB
VmHWM:	   48000 kB
VmRSS:	   47000 kB
RssAnon:	   40000 kB
RssFile:	    6000 kB
RssShmem:	    1000 kB
VmSwap:	      12 kB
Threads:	9
SigQ:	0/96000
`

const netDevFixture = `Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
tap1a2b3c4d-0: 5000 40 0 0 0 0 0 0 7000 50 0 0 0 0 0 0
  eth0: 123456789   23446    3    0    0     0          0         0  2353228   23824    5    0    0     0       0          0
`

func TestParseStat(t *testing.T) {
	st, err := ParseStat([]byte(statFixture))
	if err != nil {
		t.Fatal(err)
	}
	want := Stat{State: 'S', PPID: 4200, MinFlt: 1500, MajFlt: 7, UTime: 250, STime: 125, StartTime: 1351829}
	if st != want {
		t.Fatalf("ParseStat = %+v, want %+v", st, want)
	}
	for _, bad := range []string{"", "4242 no paren S 1", "4242 (x) S 1 2 3", "4242 (x) S x 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1"} {
		if _, err := ParseStat([]byte(bad)); err == nil {
			t.Errorf("ParseStat(%q) succeeded", bad)
		}
	}
}

func TestParseStatus(t *testing.T) {
	st, err := ParseStatus([]byte(statusFixture))
	if err != nil {
		t.Fatal(err)
	}
	want := Status{VmRSS: 47000 << 10, RssAnon: 40000 << 10, RssShmem: 1000 << 10, VmSwap: 12 << 10}
	if st != want {
		t.Fatalf("ParseStatus = %+v, want %+v", st, want)
	}
	// A kernel thread has no memory lines.
	if st, err := ParseStatus([]byte("Name:\tkthreadd\nThreads:\t1\n")); err != nil || st != (Status{}) {
		t.Fatalf("kernel thread: %+v, %v", st, err)
	}
	if _, err := ParseStatus([]byte("VmRSS:\t12 MB\n")); err == nil {
		t.Fatal("an unknown unit was accepted")
	}
}

func TestParseNetDev(t *testing.T) {
	ifaces, err := ParseNetDev([]byte(netDevFixture))
	if err != nil {
		t.Fatal(err)
	}
	if len(ifaces) != 3 {
		t.Fatalf("interfaces: %+v", ifaces)
	}
	eth0, ok := FindInterface(ifaces, "eth0")
	want := Interface{Name: "eth0", RxBytes: 123456789, RxErrors: 3, TxBytes: 2353228, TxErrors: 5}
	if !ok || eth0 != want {
		t.Fatalf("eth0 = %+v, want %+v", eth0, want)
	}
	if _, ok := FindInterface(ifaces, "eth1"); ok {
		t.Fatal("found an interface that is not there")
	}
	if _, err := ParseNetDev([]byte("h1\nh2\n eth0: 1 2 3\n")); err == nil {
		t.Fatal("a short line was accepted")
	}
}

// fakeProc writes a /proc with one process.
func fakeProc(t *testing.T, pid string, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, data := range files {
		path := filepath.Join(root, pid, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestReadProcess(t *testing.T) {
	root := fakeProc(t, "4242", map[string]string{"stat": statFixture, "status": statusFixture, "net/dev": netDevFixture})
	p, err := ReadProcess(root, 4242)
	if err != nil {
		t.Fatal(err)
	}
	want := Process{
		CPUNanos: 375 * 10_000_000, StartTicks: 1351829, MinorFaults: 1500, MajorFaults: 7,
		RSS: 47000 << 10, RSSAnon: 40000 << 10, RSSShmem: 1000 << 10, Swap: 12 << 10,
	}
	if *p != want {
		t.Fatalf("ReadProcess = %+v, want %+v", *p, want)
	}
	if ticks, err := StartTicks(root, 4242); err != nil || ticks != 1351829 {
		t.Fatalf("StartTicks = %d, %v", ticks, err)
	}
	ifaces, err := ReadNetDev(root, 4242)
	if err != nil || len(ifaces) != 3 {
		t.Fatalf("ReadNetDev = %+v, %v", ifaces, err)
	}
	for _, pid := range []int{4243, 0} {
		if _, err := ReadProcess(root, pid); !errors.Is(err, ErrGone) {
			t.Fatalf("pid %d: %v, want ErrGone", pid, err)
		}
	}
	zombie := fakeProc(t, "7", map[string]string{"stat": "7 (ch) Z 1 7 7 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 99 0 0 0\n", "status": "Threads:\t1\n"})
	if _, err := ReadProcess(zombie, 7); !errors.Is(err, ErrGone) {
		t.Fatalf("zombie: %v, want ErrGone", err)
	}
}

// Kept-open files sample their process again and again, and once it is gone they say so, even
// though its PID may be another process's by then.
func TestProcessFilesFollowTheirProcess(t *testing.T) {
	child := exec.Command("sleep", "600")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	f, err := OpenProcess("/proc", child.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	first, err := f.Sample()
	if err != nil || first.StartTicks == 0 || first.RSS == 0 {
		t.Fatalf("first sample: %+v, %v", first, err)
	}
	again, err := f.Sample()
	if err != nil || again.StartTicks != first.StartTicks {
		t.Fatalf("second sample: %+v, %v; want the same process as %+v", again, err, first)
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	if p, err := f.Sample(); !errors.Is(err, ErrGone) {
		t.Fatalf("a sample of a reaped process: %+v, %v; want ErrGone", p, err)
	}
}

// BenchmarkSample is the cost of one hypervisor's sample in the stats RPCs: files kept open
// against files opened for each sample.
func BenchmarkSample(b *testing.B) {
	b.Run("kept-open", func(b *testing.B) {
		f, err := OpenProcess("/proc", os.Getpid())
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		for b.Loop() {
			if _, err := f.Sample(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("opened-each-time", func(b *testing.B) {
		for b.Loop() {
			if _, err := ReadProcess("/proc", os.Getpid()); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestReadsThisProcess checks the parsers against the real /proc of this kernel.
func TestReadsThisProcess(t *testing.T) {
	p, err := ReadProcess("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if p.RSS == 0 || p.RSSAnon == 0 || p.StartTicks == 0 {
		t.Fatalf("this process: %+v", p)
	}
	if _, err := ReadNetDev("/proc", os.Getpid()); err != nil {
		t.Fatal(err)
	}
	tree, err := Tree("/proc", os.Getppid())
	if err != nil {
		t.Fatal(err)
	}
	if tree[0] != os.Getppid() || !slices.Contains(tree, os.Getpid()) {
		t.Fatalf("the tree of the parent %d does not hold this process %d: %v", os.Getppid(), os.Getpid(), tree)
	}
}

// TestTree: process 10's tree, parents before their children, from the kernel's lists of each
// thread's children where it has them (99 ended during the walk), else from every process's parent.
func TestTree(t *testing.T) {
	stat := func(pid, ppid string) string {
		return pid + " (p) S " + ppid + " 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0\n"
	}
	for name, files := range map[string]map[string]string{
		"children lists": {
			"10/task/10/children": "11 ", "10/task/14/children": "13 99 ", "11/task/11/children": "12 ",
			"12/task/12/children": "", "13/task/13/children": "",
		},
		"parents": {
			"10/stat": stat("10", "1"), "11/stat": stat("11", "10"), "12/stat": stat("12", "11"),
			"13/stat": stat("13", "10"), "20/stat": stat("20", "1"),
		},
	} {
		root := t.TempDir()
		for path, content := range files {
			if err := os.MkdirAll(filepath.Dir(filepath.Join(root, path)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, path), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		tree, err := Tree(root, 10)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		slices.Sort(tree[1:3])
		if !slices.Equal(tree, []int{10, 11, 13, 12}) {
			t.Errorf("%s: Tree = %v, want 10, then 11 and 13, then 12", name, tree)
		}
	}
}

func BenchmarkTree(b *testing.B) {
	for b.Loop() {
		if _, err := Tree("/proc", os.Getpid()); err != nil {
			b.Fatal(err)
		}
	}
}

func TestAllocatedBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cow.raw")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// A 1 GiB sparse disk with 1 MiB written at its end.
	if _, err := f.WriteAt(make([]byte, 1<<20), (1<<30)-(1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	used, err := AllocatedBytes(path)
	if err != nil {
		t.Fatal(err)
	}
	// The filesystem may round up to its block or extent size, but not to the file's size.
	if used < 1<<20 || used >= 1<<29 {
		t.Fatalf("AllocatedBytes = %d, want about 1 MiB of a sparse 1 GiB file", used)
	}
	if _, err := AllocatedBytes(path + ".missing"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

func TestCPURate(t *testing.T) {
	var r CPURate
	const s = int64(1e9)
	// First sample: the average since the VM began.
	if got, ok := r.Observe("c1", 100, 10*s, uint64(2*s), 6*s); !ok || got != 5e8 {
		t.Fatalf("first sample: %d %v, want half a core", got, ok)
	}
	// Next: from the previous sample (1 core over 2 s).
	if got, ok := r.Observe("c1", 100, 12*s, uint64(4*s), 6*s); !ok || got != 1e9 {
		t.Fatalf("second sample: %d %v, want one core", got, ok)
	}
	// The same instant again (another client): the rate just measured, and the sample is kept.
	if got, ok := r.Observe("c1", 100, 12*s, uint64(4*s), 6*s); !ok || got != 1e9 {
		t.Fatalf("same instant: %d %v", got, ok)
	}
	if got, ok := r.Observe("c1", 100, 14*s, uint64(4*s+s/2), 6*s); !ok || got != 25e7 {
		t.Fatalf("third sample: %d %v, want a quarter core", got, ok)
	}
	// Another process behind the key (a PID reused, counters reset) starts afresh.
	if got, ok := r.Observe("c1", 200, 15*s, uint64(s), 13*s); !ok || got != 5e8 {
		t.Fatalf("new process: %d %v", got, ok)
	}
	// Unknown start and no earlier sample: no rate.
	if _, ok := r.Observe("c2", 1, 15*s, 5, 0); ok {
		t.Fatal("a rate without an interval")
	}
	r.Forget(func(k string) bool { return k == "c2" })
	if r.Len() != 1 {
		t.Fatalf("after Forget: %d keys", r.Len())
	}
}

func TestProcessIdentityTellsAReusedPID(t *testing.T) {
	pid := os.Getpid()
	start, err := StartTicks("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		p    ProcessIdentity
		want bool
	}{
		{ProcessIdentity{PID: pid, Start: start}, true},
		{ProcessIdentity{PID: pid}, true},                    // the start unknown: any process with the PID
		{ProcessIdentity{PID: pid, Start: start + 1}, false}, // another process that got the PID
		{ProcessIdentity{}, false},
	} {
		if got := tc.p.Alive("/proc"); got != tc.want {
			t.Errorf("%+v alive: %v, want %v", tc.p, got, tc.want)
		}
	}
}
