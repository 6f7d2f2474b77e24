package cocoon

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/containerd/errdefs"
)

// Kinds of cocoon failure that callers act on. Test with errors.Is; each is of an errdefs kind,
// which the CRI edge maps to a gRPC code.
var (
	// ErrNotFound: the VM, snapshot or image does not exist. cocoon's rm and inspect exit 1 for
	// missing objects, so idempotent deletes test for this.
	ErrNotFound = fmt.Errorf("%w", errdefs.ErrNotFound)
	// ErrAlreadyExists: a VM or snapshot name is taken.
	ErrAlreadyExists = fmt.Errorf("%w", errdefs.ErrAlreadyExists)
	// ErrInUse: the object is busy, for example a running VM removed without --force.
	ErrInUse = errdefs.ErrFailedPrecondition.WithMessage("in use")
	// ErrInvalid: cocoon refused the arguments (names, sizes, resource minimums, ambiguous refs).
	ErrInvalid = fmt.Errorf("%w", errdefs.ErrInvalidArgument)
	// ErrUnsupported: the installed cocoon does not have the command or flag.
	ErrUnsupported = errdefs.ErrNotImplemented.WithMessage("unsupported by this cocoon")
	// ErrNoSpace: a file system cocoon wrote to is full (a snapshot save, an import).
	ErrNoSpace = errdefs.ErrResourceExhausted.WithMessage("no space left")
)

// CommandError is a failed cocoon invocation.
type CommandError struct {
	// Args is the command line after the global flags, e.g. ["vm", "rm", "--force", ID].
	Args []string
	// ExitCode is the process exit code, or -1 when it did not exit normally.
	ExitCode int
	// Message is cocoon's own error text (the "Error: " line of stderr, ANSI stripped).
	Message string
	// Kind is one of the Err* values above, or nil when the failure is not classified.
	Kind error
	// Err is the underlying execution error (exit status, timeout, binary missing).
	Err error
}

func (e *CommandError) Error() string {
	cmd := "cocoon " + strings.Join(e.Args, " ")
	if e.Message != "" {
		return fmt.Sprintf("%s: %s", cmd, e.Message)
	}
	return fmt.Sprintf("%s: %v", cmd, e.Err)
}

// Unwrap lets errors.Is see both the kind and the execution error (context.DeadlineExceeded,
// exec.ErrNotFound, ...).
func (e *CommandError) Unwrap() []error {
	var errs []error
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// ansiEscape matches the colour sequences zerolog's console writer emits even when stderr is not a
// terminal.
var ansiEscape = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]`)

// StripANSI removes terminal escape sequences.
func StripANSI(s string) string {
	return ansiEscape.ReplaceAllString(s, "")
}

// errorMessage returns cocoon's error text from stderr: the last "Error: " line cobra printed, or
// the last non-empty line when there is none (a panic, a killed process).
func errorMessage(stderr string) string {
	lines := strings.Split(StripANSI(stderr), "\n")
	last := ""
	for i := len(lines) - 1; i >= 0; i-- {
		line := strings.TrimSpace(lines[i])
		if line == "" {
			continue
		}
		if msg, ok := strings.CutPrefix(line, "Error: "); ok {
			return msg
		}
		if last == "" {
			last = line
		}
	}
	return last
}

// The substrings are cocoon's own messages, worded alike by v0.3.8 and v0.5
// (docs/cocoon-contract.md section 1.8). Order matters: the first match wins.
var errorPatterns = []struct {
	substr string
	kind   error
}{
	{"VM not found", ErrNotFound},
	{"snapshot not found", ErrNotFound},
	{"not found in any backend", ErrNotFound},
	{"not resolved", ErrNotFound},
	{"already exists", ErrAlreadyExists},
	{"already in use by", ErrAlreadyExists},
	{"force required", ErrInUse},
	// EBUSY as cloud-hypervisor relays it through vm.add-device (Rust's wording) and as Go words
	// it: a VFIO group another VM holds opens once.
	{"Device or resource busy", ErrInUse},
	{"device or resource busy", ErrInUse},
	{"unknown command", ErrUnsupported},
	{"unknown flag", ErrUnsupported},
	{"unknown shorthand flag", ErrUnsupported},
	{"ambiguous ref", ErrInvalid},
	{"resolves to multiple backends", ErrInvalid},
	{"cannot be empty", ErrInvalid},
	{"is invalid", ErrInvalid},
	{"must be at least", ErrInvalid},
	{"must be non-negative", ErrInvalid},
	{"exceeds host cores", ErrInvalid},
	{"below snapshot minimum", ErrInvalid},
	{"not supported: Firecracker", ErrInvalid},
	{"mutually exclusive", ErrInvalid},
	{"requires cloudimg", ErrInvalid},
	{"requires OCI images", ErrInvalid},
	{"invalid --", ErrInvalid},
	{"must be KEY=VALUE", ErrInvalid},
	{"invalid DNS server address", ErrInvalid},
	{"cannot detect file type", ErrInvalid},
	{"invalid snapshot archive", ErrInvalid},
	{"invalid image reference", ErrInvalid},
	{"no space left on device", ErrNoSpace},
	// snapshot save of a VM with a hot-attached disk or share.
	{"detach before snapshot", ErrInUse},
}

func classify(message string) error {
	for _, p := range errorPatterns {
		if strings.Contains(message, p.substr) {
			return p.kind
		}
	}
	return nil
}
