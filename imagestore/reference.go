package imagestore

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/distribution/reference"
)

// Normalize turns a user's image reference into the full form images are recorded under
// (docker.io/library/name:latest for a bare name), like other CRI runtimes do. A reference with
// both a tag and a digest names the digest: repo@digest.
func Normalize(ref string) (string, error) {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %v: %w", ref, err, ErrInvalid)
	}
	if digested, ok := named.(reference.Digested); ok {
		canonical, err := reference.WithDigest(reference.TrimNamed(named), digested.Digest())
		if err != nil {
			return "", fmt.Errorf("image reference %q: %v: %w", ref, err, ErrInvalid)
		}
		return canonical.String(), nil
	}
	return reference.TagNameOnly(named).String(), nil
}

// isDigested reports whether a reference names a digest rather than a tag.
func isDigested(ref string) bool {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return false
	}
	_, ok := named.(reference.Digested)
	return ok
}

// NormalizeTag is Normalize for a reference that must name a tag, not a digest: the name an
// imported image is recorded under.
func NormalizeTag(ref string) (string, error) {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %v: %w", ref, err, ErrInvalid)
	}
	if _, ok := named.(reference.Digested); ok {
		return "", fmt.Errorf("image reference %q names a digest; give a tag such as repo:v1: %w", ref, ErrInvalid)
	}
	return reference.TagNameOnly(named).String(), nil
}

// repository is the reference without tag or digest.
func repository(ref string) string {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return ref
	}
	return named.Name()
}

var (
	fullDigest = regexp.MustCompile(`^(sha256:)?([a-f0-9]{64})$`)
	hexPrefix  = regexp.MustCompile(`^(sha256:)?[a-f0-9]{3,64}$`)
)

// asID reads a full image ID, with or without the sha256: prefix.
func asID(s string) (string, bool) {
	m := fullDigest.FindStringSubmatch(s)
	if m == nil {
		return "", false
	}
	return "sha256:" + m[2], true
}

func isHexPrefix(s string) bool { return hexPrefix.MatchString(s) }

func hasHexPrefix(id, prefix string) bool {
	return strings.HasPrefix(strings.TrimPrefix(id, "sha256:"), strings.TrimPrefix(prefix, "sha256:"))
}
