package cocoon

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strings"

	"golang.org/x/mod/semver"
)

// VersionInfo is what cocoon version prints.
type VersionInfo struct {
	Version   string
	GitHash   string
	Built     string
	GoVersion string
	OSArch    string
}

// MinVersion is the oldest cocoon cocoon-cri runs on (docs/cocoon-contract.md).
const MinVersion = "v0.3.8"

// CheckVersion refuses a cocoon older than MinVersion. A version that is not semantic (a
// developer build) passes: the capability probe decides what such a binary can do.
func CheckVersion(version string) error {
	v := version
	if !strings.HasPrefix(v, "v") {
		v = "v" + v
	}
	if semver.IsValid(v) && semver.Compare(v, MinVersion) < 0 {
		return fmt.Errorf("cocoon %s is older than %s, the oldest cocoon-cri supports: upgrade cocoon", version, MinVersion)
	}
	return nil
}

// Version runs cocoon version. It is the cheapest call that proves the binary runs.
func (c *Client) Version(ctx context.Context) (*VersionInfo, error) {
	out, err := c.run(ctx, call{args: []string{"version"}})
	if err != nil {
		return nil, err
	}
	v := &VersionInfo{}
	fields := map[string]*string{
		"Version":        &v.Version,
		"Git hash":       &v.GitHash,
		"Built":          &v.Built,
		"Golang version": &v.GoVersion,
		"OS/Arch":        &v.OSArch,
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if dst := fields[strings.TrimSpace(key)]; ok && dst != nil {
			*dst = strings.TrimSpace(value)
		}
	}
	if v.Version == "" {
		return nil, fmt.Errorf("cocoon version: no Version line in %q", strings.TrimSpace(string(out)))
	}
	return v, nil
}
