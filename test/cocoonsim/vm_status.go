package cocoonsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

const (
	// watchPoll is how often the index files are checked for changes (cocoon uses fsnotify).
	watchPoll = 100 * time.Millisecond
	// watchDebounce coalesces bursts of index writes, like cocoon's 200 ms fsnotify debounce.
	watchDebounce = 200 * time.Millisecond
)

// vmStatus runs until SIGINT/SIGTERM (on v0.5 only with --event or --watch; otherwise it prints
// the list once). It refreshes when a vms.json changes and every -n seconds;
// hypervisor liveness is only re-checked on those refreshes, so a crash shows up at the next tick.
func (a *app) vmStatus(cmd *cobra.Command, args []string) error {
	interval, _ := cmd.Flags().GetInt("interval")
	if interval <= 0 {
		interval = 5
	}
	eventMode, _ := cmd.Flags().GetBool("event")
	watchMode, _ := cmd.Flags().GetBool("watch")
	if eventMode && watchMode {
		return errors.New("--event and --watch are mutually exclusive")
	}
	format, _ := cmd.Flags().GetString("format")
	backends, err := allBackends(a.conf, a.log)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	if a.profile.StatusOnce && !eventMode && !watchMode {
		vms, err := listAllVMs(ctx, backends)
		if err != nil {
			return err
		}
		return a.printVMList(cmd, filterVMs(vms, args))
	}
	var paths []string
	for _, b := range backends {
		paths = append(paths, b.db.path)
	}
	changed := watchFiles(ctx, paths)
	ticker := time.NewTicker(time.Duration(interval) * time.Second)
	defer ticker.Stop()

	list := func() []*cocoon.VM {
		vms, err := listAllVMs(ctx, backends)
		if err != nil {
			a.log.with("cmd.vm.listAndFilter").Warnf("list: %v", err)
			return nil
		}
		return filterVMs(vms, args)
	}
	out := cmd.OutOrStdout()
	var refresh func()
	switch {
	case eventMode && format == "json":
		refresh = jsonEventLoop(out, list)
	case eventMode:
		fmt.Fprintln(out, "EVENT\tID\tNAME\tSTATE\tCPU\tMEMORY\tIP\tIMAGE") //nolint:errcheck
		refresh = textEventLoop(out, list)
	default:
		refresh = refreshLoop(out, list)
	}
	refresh()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			refresh()
		case <-ticker.C:
			refresh()
		}
	}
}

// vmDigest is what a status event compares: a change in any field is a MODIFIED event.
type vmDigest struct {
	id, name, state, ip, image string
	cpu                        int
	memory                     int64
}

func digestOf(vm *cocoon.VM) vmDigest {
	return vmDigest{
		id: vm.ID, name: vm.Config.Name, state: string(reconcileState(vm)), ip: vmIPs(vm),
		image: vm.Config.Image, cpu: vm.Config.CPU, memory: vm.Config.Memory,
	}
}

// jsonEventLoop emits one {"event":..., "vm":...} line per change, the VM with reconciled state;
// DELETED carries the last record seen.
func jsonEventLoop(out io.Writer, list func() []*cocoon.VM) func() {
	type seen struct {
		digest vmDigest
		vm     cocoon.VM
	}
	enc := json.NewEncoder(out)
	prev := map[string]seen{}
	return func() {
		vms := list()
		curr := make(map[string]seen, len(vms))
		for _, vm := range vms {
			d := digestOf(vm)
			vm.State = reconcileState(vm)
			curr[vm.ID] = seen{digest: d, vm: *vm}
			switch old, ok := prev[vm.ID]; {
			case !ok:
				_ = enc.Encode(cocoon.Event{Event: cocoon.EventAdded, VM: *vm})
			case old.digest != d:
				_ = enc.Encode(cocoon.Event{Event: cocoon.EventModified, VM: *vm})
			}
		}
		for id, old := range prev {
			if _, ok := curr[id]; !ok {
				_ = enc.Encode(cocoon.Event{Event: cocoon.EventDeleted, VM: old.vm})
			}
		}
		prev = curr
	}
}

func textEventLoop(out io.Writer, list func() []*cocoon.VM) func() {
	prev := map[string]vmDigest{}
	return func() {
		w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		curr := map[string]vmDigest{}
		for _, vm := range list() {
			d := digestOf(vm)
			curr[vm.ID] = d
			switch old, ok := prev[vm.ID]; {
			case !ok:
				printEventRow(w, cocoon.EventAdded, d)
			case old != d:
				printEventRow(w, cocoon.EventModified, d)
			}
		}
		for id, d := range prev {
			if _, ok := curr[id]; !ok {
				printEventRow(w, cocoon.EventDeleted, d)
			}
		}
		_ = w.Flush()
		prev = curr
	}
}

func printEventRow(w io.Writer, event string, d vmDigest) {
	fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", event, d.id, d.name, d.state, d.cpu, bytesSize(d.memory), d.ip, d.image) //nolint:errcheck
}

// refreshLoop reprints the whole table whenever anything changed.
func refreshLoop(out io.Writer, list func() []*cocoon.VM) func() {
	var prev []vmDigest
	return func() {
		vms := list()
		curr := make([]vmDigest, len(vms))
		for i, vm := range vms {
			curr[i] = digestOf(vm)
		}
		if slices.Equal(prev, curr) { // like cocoon: nothing at all is printed while there are no VMs
			return
		}
		prev = curr
		now := time.Now()
		fmt.Fprintf(out, "Every %s — press Ctrl+C to quit (%s)\n\n", now.Format(time.TimeOnly), now.Format(time.DateOnly)) //nolint:errcheck
		if len(vms) == 0 {
			fmt.Fprintln(out, "No VMs found.") //nolint:errcheck
			return
		}
		w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		printVMTable(w, vms)
		_ = w.Flush()
	}
}

// filterVMs keeps VMs matching any filter by ID, name or ID prefix (at least 3 characters).
func filterVMs(vms []*cocoon.VM, filters []string) []*cocoon.VM {
	if len(filters) == 0 {
		return vms
	}
	var out []*cocoon.VM
	for _, vm := range vms {
		for _, f := range filters {
			if vm.ID == f || vm.Config.Name == f || (len(f) >= minPrefixLen && strings.HasPrefix(vm.ID, f)) {
				out = append(out, vm)
				break
			}
		}
	}
	return out
}

// watchFiles signals (debounced) when any of paths is replaced or rewritten.
func watchFiles(ctx context.Context, paths []string) <-chan struct{} {
	ch := make(chan struct{}, 1)
	stamp := func() string {
		var b strings.Builder
		for _, p := range paths {
			var st syscall.Stat_t
			if syscall.Stat(p, &st) == nil {
				fmt.Fprintf(&b, "%d/%d/%d;", st.Ino, st.Mtim.Nano(), st.Size)
			}
		}
		return b.String()
	}
	go func() {
		last := stamp()
		ticker := time.NewTicker(watchPoll)
		defer ticker.Stop()
		var debounce <-chan time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
				if s := stamp(); s != last {
					last = s
					if debounce == nil {
						debounce = time.After(watchDebounce)
					}
				}
			case <-debounce:
				debounce = nil
				select {
				case ch <- struct{}{}:
				default:
				}
			}
		}
	}()
	return ch
}
