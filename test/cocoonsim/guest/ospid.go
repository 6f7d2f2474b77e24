package guest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// OSPID returns the PID of the guest OS process of a running simulated hypervisor, or 0 when the
// guest has none (it is not running, or it has no network namespace of its own yet). The
// process's namespaces are the guest's: `nsenter -t PID -n -u` runs a command "inside the guest".
func OSPID(hypervisorPID int) (int, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", hypervisorPID))
	if err != nil {
		return 0, err
	}
	for _, task := range tasks {
		data, err := os.ReadFile(task) //nolint:gosec // procfs
		if err != nil {
			continue
		}
		for field := range strings.FieldsSeq(string(data)) {
			pid, err := strconv.Atoi(field)
			if err == nil && isGuestOS(pid) {
				return pid, nil
			}
		}
	}
	return 0, nil
}

func isGuestOS(pid int) bool {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	argv0, _, _ := bytes.Cut(cmdline, []byte{0})
	return string(argv0) == guestOSArgv0
}
