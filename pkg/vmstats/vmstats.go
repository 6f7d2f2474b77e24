// Package vmstats reads what a VM costs the node from the hypervisor process, without asking
// cocoon: under cloud-hypervisor or Firecracker the guest's vCPUs are the process's threads and
// the guest's memory is the process's memory, so /proc/<pid> is the VM's usage. It also reads the
// pod interface's counters (/proc/<pid>/net/dev: the hypervisor runs in the namespace that holds
// the pod interface) and the writable disk's allocated bytes.
package vmstats

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// userHZ is the unit of the CPU times in /proc/<pid>/stat. The kernel exports them in USER_HZ,
// which is 100 on every architecture Linux (and so Kubernetes) runs on, whatever CONFIG_HZ is.
const userHZ = 100

// ErrGone is returned when the process no longer exists.
var ErrGone = errors.New("process is gone")

// Process is one sample of a process's usage.
type Process struct {
	// CPUNanos is the CPU time all its threads used, living and exited (utime + stime).
	CPUNanos uint64
	// StartTicks is when it started, in clock ticks since boot: with the PID it names the process,
	// since PIDs are reused.
	StartTicks  uint64
	MinorFaults uint64
	MajorFaults uint64
	// Resident memory in bytes: RSS is all of it, RSSAnon and RSSShmem the parts a VM's guest
	// memory lives in (file-backed pages can be dropped and reread).
	RSS, RSSAnon, RSSShmem uint64
	// Swap is the bytes swapped out.
	Swap uint64
}

// ReadProcess samples process pid under procRoot ("/proc" on a host). A process that is gone,
// or became a zombie (it no longer holds memory), is ErrGone.
func ReadProcess(procRoot string, pid int) (*Process, error) {
	f, err := OpenProcess(procRoot, pid)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Sample()
}

// ProcessFiles are a process's stat and status files, kept open: read again from the start, they
// give a new sample without the path look-ups of opening them, most of a sample's cost
// (BenchmarkSample). They stay bound to the process they were opened for: once it is gone,
// reads fail (ESRCH) rather than read another process that got the same PID.
type ProcessFiles struct {
	pid          int
	dir          string
	stat, status *os.File
	// netDev is opened at the first NetDev: it holds the process's network namespace alive.
	netDev *os.File
	buf    []byte
}

// OpenProcess opens process pid's files under procRoot.
func OpenProcess(procRoot string, pid int) (*ProcessFiles, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("pid %d: %w", pid, ErrGone)
	}
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	stat, err := os.Open(filepath.Join(dir, "stat"))
	if err != nil {
		return nil, gone(pid, err)
	}
	status, err := os.Open(filepath.Join(dir, "status"))
	if err != nil {
		stat.Close()
		return nil, gone(pid, err)
	}
	return &ProcessFiles{pid: pid, dir: dir, stat: stat, status: status}, nil
}

// PID is the process the files belong to.
func (f *ProcessFiles) PID() int { return f.pid }

// Close closes the files.
func (f *ProcessFiles) Close() error {
	err := errors.Join(f.stat.Close(), f.status.Close())
	if f.netDev != nil {
		err = errors.Join(err, f.netDev.Close())
	}
	return err
}

// NetDev reads the interfaces of the process's network namespace (ReadNetDev), through a file
// kept open from the first call. It is not safe for concurrent use.
func (f *ProcessFiles) NetDev() ([]Interface, error) {
	if f.netDev == nil {
		file, err := os.Open(filepath.Join(f.dir, "net", "dev"))
		if err != nil {
			return nil, gone(f.pid, err)
		}
		f.netDev = file
	}
	data, err := f.read(f.netDev)
	if err != nil {
		return nil, gone(f.pid, err)
	}
	return ParseNetDev(data)
}

// Sample reads the process's usage now. It is not safe for concurrent use.
func (f *ProcessFiles) Sample() (*Process, error) {
	statData, err := f.read(f.stat)
	if err != nil {
		return nil, gone(f.pid, err)
	}
	st, err := ParseStat(statData)
	if err != nil {
		return nil, fmt.Errorf("pid %d: %w", f.pid, err)
	}
	if st.State == 'Z' || st.State == 'X' {
		return nil, fmt.Errorf("pid %d is a zombie: %w", f.pid, ErrGone)
	}
	statusData, err := f.read(f.status)
	if err != nil {
		return nil, gone(f.pid, err)
	}
	status, err := ParseStatus(statusData)
	if err != nil {
		return nil, fmt.Errorf("pid %d: %w", f.pid, err)
	}
	return &Process{
		CPUNanos:    (st.UTime + st.STime) * (1e9 / userHZ),
		StartTicks:  st.StartTime,
		MinorFaults: st.MinFlt,
		MajorFaults: st.MajFlt,
		RSS:         status.VmRSS,
		RSSAnon:     status.RssAnon,
		RSSShmem:    status.RssShmem,
		Swap:        status.VmSwap,
	}, nil
}

// read reads file whole from its start into the files' buffer, valid until the next read: the
// kernel makes a /proc file's text anew when it is read from offset 0.
func (f *ProcessFiles) read(file *os.File) ([]byte, error) {
	if f.buf == nil {
		f.buf = make([]byte, 4096)
	}
	n := 0
	for {
		if n == len(f.buf) {
			f.buf = append(f.buf, make([]byte, len(f.buf))...)
		}
		m, err := file.ReadAt(f.buf[n:], int64(n))
		n += m
		if errors.Is(err, io.EOF) || (err == nil && m == 0) {
			return f.buf[:n], nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// StartTicks reads only when process pid started (clock ticks since boot), to recognise it later.
func StartTicks(procRoot string, pid int) (uint64, error) {
	st, err := ReadStat(procRoot, pid)
	return st.StartTime, err
}

// ReadStat reads /proc/<pid>/stat; ErrGone when there is no such process.
func ReadStat(procRoot string, pid int) (Stat, error) {
	data, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return Stat{}, gone(pid, err)
	}
	st, err := ParseStat(data)
	if err != nil {
		return Stat{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	return st, nil
}

// ProcessIdentity names one process: its PID and, when known, when it started (clock ticks since
// boot), which tells it from a later process given the same PID.
type ProcessIdentity struct {
	PID   int
	Start uint64 // 0: unknown, and then any process with the PID is taken for it
}

// Alive says whether the process runs (a zombie has ended) and, when its start is known, is the
// one named.
func (p ProcessIdentity) Alive(procRoot string) bool {
	if !Running(procRoot, p.PID) {
		return false
	}
	if p.Start == 0 {
		return true
	}
	start, err := StartTicks(procRoot, p.PID)
	return err == nil && start == p.Start
}

// Running says whether pid is a process that has not exited. A zombie has: it only waits for its
// parent to reap it, and holds no memory and runs nothing.
func Running(procRoot string, pid int) bool {
	if pid <= 0 {
		return false
	}
	st, err := ReadStat(procRoot, pid)
	return err == nil && st.State != 'Z' && st.State != 'X'
}

func gone(pid int, err error) error {
	// ESRCH: the process exited between opening its directory and reading the file.
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("pid %d: %w", pid, ErrGone)
	}
	return fmt.Errorf("pid %d: %w", pid, err)
}

// Stat is the part of /proc/<pid>/stat used here (proc(5) field numbers in comments).
type Stat struct {
	State     byte   // 3
	PPID      int    // 4
	MinFlt    uint64 // 10
	MajFlt    uint64 // 12
	UTime     uint64 // 14, clock ticks
	STime     uint64 // 15, clock ticks
	StartTime uint64 // 22, clock ticks since boot
}

// ParseStat parses /proc/<pid>/stat. The command name (field 2) may hold spaces and parentheses,
// so the fields are counted from its last ')'.
func ParseStat(data []byte) (Stat, error) {
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return Stat{}, errors.New("stat: no command name")
	}
	fields := strings.Fields(string(data[end+1:]))
	// fields[0] is field 3 (state).
	const first = 3
	if len(fields) < 22-first+1 {
		return Stat{}, fmt.Errorf("stat: %d fields after the command name", len(fields))
	}
	var st Stat
	if len(fields[0]) != 1 {
		return Stat{}, fmt.Errorf("stat: state %q", fields[0])
	}
	st.State = fields[0][0]
	ppid, err := strconv.Atoi(fields[4-first])
	if err != nil {
		return Stat{}, fmt.Errorf("stat: ppid: %w", err)
	}
	st.PPID = ppid
	for _, f := range []struct {
		n   int
		dst *uint64
	}{{10, &st.MinFlt}, {12, &st.MajFlt}, {14, &st.UTime}, {15, &st.STime}, {22, &st.StartTime}} {
		v, err := strconv.ParseUint(fields[f.n-first], 10, 64)
		if err != nil {
			return Stat{}, fmt.Errorf("stat: field %d: %w", f.n, err)
		}
		*f.dst = v
	}
	return st, nil
}

// Status is the part of /proc/<pid>/status used here, memory in bytes.
type Status struct {
	VmRSS, RssAnon, RssShmem, VmSwap uint64
}

// ParseStatus parses /proc/<pid>/status. Kernel threads have no Vm* lines; they read as zero. It
// reads the lines in place: the stats RPCs parse one status per running VM.
func ParseStatus(data []byte) (Status, error) {
	var st Status
	for line := range bytes.Lines(data) {
		key, value, ok := bytes.Cut(bytes.TrimSuffix(line, []byte("\n")), []byte(":"))
		if !ok {
			continue
		}
		var dst *uint64
		switch string(key) {
		case "VmRSS":
			dst = &st.VmRSS
		case "RssAnon":
			dst = &st.RssAnon
		case "RssShmem":
			dst = &st.RssShmem
		case "VmSwap":
			dst = &st.VmSwap
		default:
			continue
		}
		number, unit, _ := bytes.Cut(bytes.TrimSpace(value), []byte(" "))
		if len(number) == 0 {
			return Status{}, fmt.Errorf("status: %s has no value", key)
		}
		v, err := strconv.ParseUint(string(number), 10, 64)
		if err != nil {
			return Status{}, fmt.Errorf("status: %s: %w", key, err)
		}
		switch string(bytes.TrimSpace(unit)) {
		case "":
		case "kB":
			v *= 1024
		default:
			return Status{}, fmt.Errorf("status: %s: unexpected value %q", key, value)
		}
		*dst = v
	}
	return st, nil
}

// Interface is one network interface's counters.
type Interface struct {
	Name     string
	RxBytes  uint64
	RxErrors uint64
	TxBytes  uint64
	TxErrors uint64
}

// ReadNetDev reads the interfaces of the network namespace process pid is in.
func ReadNetDev(procRoot string, pid int) ([]Interface, error) {
	data, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "net", "dev"))
	if err != nil {
		return nil, gone(pid, err)
	}
	return ParseNetDev(data)
}

// ParseNetDev parses /proc/net/dev: two header lines, then "name: 8 receive and 8 transmit
// counters" per interface.
func ParseNetDev(data []byte) ([]Interface, error) {
	var out []Interface
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 0; sc.Scan(); line++ {
		if line < 2 {
			continue
		}
		name, counters, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			return nil, fmt.Errorf("net/dev: line %d has no interface name", line+1)
		}
		fields := strings.Fields(counters)
		if len(fields) < 16 {
			return nil, fmt.Errorf("net/dev: %s: %d counters, want 16", strings.TrimSpace(name), len(fields))
		}
		iface := Interface{Name: strings.TrimSpace(name)}
		for _, f := range []struct {
			i   int
			dst *uint64
		}{{0, &iface.RxBytes}, {2, &iface.RxErrors}, {8, &iface.TxBytes}, {10, &iface.TxErrors}} {
			v, err := strconv.ParseUint(fields[f.i], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("net/dev: %s: %w", iface.Name, err)
			}
			*f.dst = v
		}
		out = append(out, iface)
	}
	return out, sc.Err()
}

// FindInterface returns the interface called name.
func FindInterface(ifaces []Interface, name string) (Interface, bool) {
	for _, i := range ifaces {
		if i.Name == name {
			return i, true
		}
	}
	return Interface{}, false
}

// AllocatedBytes is the disk space a file takes: its allocated blocks, not its size, since a VM's
// writable disk is sparse and grows as the guest writes.
func AllocatedBytes(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	// st_blocks counts 512-byte units whatever the filesystem's block size (stat(2)).
	return uint64(st.Blocks) * 512, nil
}

// Tree is process pid and its descendants, parents before their children. A process that exits
// during the walk is left out. It asks the kernel for each thread's children
// (/proc/PID/task/TID/children) where the kernel lists them (CONFIG_PROC_CHILDREN, which CRIU
// needs, so the usual distributions' kernels); elsewhere it reads the parent of every process on
// the node, which costs about 12 µs a process (1.4 ms on a quiet node of 120).
func Tree(procRoot string, pid int) ([]int, error) {
	var tree []int
	for queue := []int{pid}; len(queue) > 0; queue = queue[1:] {
		children, err := childrenOf(procRoot, queue[0])
		switch {
		case errors.Is(err, errNoChildrenFiles):
			return treeByParents(procRoot, pid)
		case errors.Is(err, ErrGone):
			continue
		case err != nil:
			return nil, err
		}
		tree = append(tree, queue[0])
		queue = append(queue, children...)
	}
	if len(tree) == 0 {
		tree = []int{pid} // as the walk of parents gives it
	}
	return tree, nil
}

// errNoChildrenFiles says that the kernel does not list a process's children.
var errNoChildrenFiles = errors.New("the kernel lists no children in /proc")

// childrenOf is what the threads of process pid started, from their children files; ErrGone if
// the process ended.
func childrenOf(procRoot string, pid int) ([]int, error) {
	procDir := filepath.Join(procRoot, strconv.Itoa(pid))
	tasks, err := os.ReadDir(filepath.Join(procDir, "task"))
	if errors.Is(err, os.ErrNotExist) {
		if _, statErr := os.Stat(procDir); statErr == nil {
			return nil, errNoChildrenFiles // a process without threads listed
		}
		return nil, ErrGone
	}
	if err != nil {
		return nil, fmt.Errorf("list threads of %d: %w", pid, err)
	}
	var children []int
	for _, task := range tasks {
		taskDir := filepath.Join(procDir, "task", task.Name())
		data, err := os.ReadFile(filepath.Join(taskDir, "children"))
		if errors.Is(err, os.ErrNotExist) {
			if _, statErr := os.Stat(taskDir); statErr == nil {
				return nil, errNoChildrenFiles
			}
			continue // the thread ended meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("read children of %d/%s: %w", pid, task.Name(), err)
		}
		for field := range strings.FieldsSeq(string(data)) {
			child, err := strconv.Atoi(field)
			if err != nil {
				return nil, fmt.Errorf("children of %d/%s: %q", pid, task.Name(), field)
			}
			children = append(children, child)
		}
	}
	return children, nil
}

// treeByParents is Tree where the kernel lists no children: every process's parent, read from
// its stat.
func treeByParents(procRoot string, pid int) ([]int, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	children := map[int][]int{}
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		st, err := ParseStat(data)
		if err != nil {
			return nil, fmt.Errorf("pid %d: %w", child, err)
		}
		children[st.PPID] = append(children[st.PPID], child)
	}
	tree := []int{pid}
	for i := 0; i < len(tree); i++ {
		tree = append(tree, children[tree[i]]...)
	}
	return tree, nil
}
