package cocoonsim

import (
	"fmt"
	"os"
	"strings"
)

// VersionEnv selects the cocoon release the simulator behaves as ("0.3.8" or "0.5.1").
const VersionEnv = "COCOON_SIM_VERSION"

// defaultVersion is the profile without VersionEnv.
const defaultVersion = "0.3.8"

// profile is what differs between the cocoon releases the simulator plays, each as that release's
// CLI does it (docs/cocoon-contract.md).
type profile struct {
	version string
	// cloneResizes: vm clone takes --cpu, --memory and --storage. From v0.5 a clone has its
	// snapshot's size, and cobra refuses those flags as unknown.
	cloneResizes bool
}

var profiles = map[string]profile{
	"0.3.8": {version: "v0.3.8", cloneResizes: true},
	"0.5.1": {version: "v0.5.1"},
}

// currentProfile is the profile VersionEnv names.
func currentProfile() (profile, error) {
	name := strings.TrimPrefix(os.Getenv(VersionEnv), "v")
	if name == "" {
		name = defaultVersion
	}
	p, ok := profiles[name]
	if !ok {
		return profile{}, fmt.Errorf("cocoon-sim: %s=%q: the simulator plays cocoon 0.3.8 or 0.5.1", VersionEnv, os.Getenv(VersionEnv))
	}
	return p, nil
}
