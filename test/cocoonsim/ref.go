package cocoonsim

import (
	"crypto/rand"
	"fmt"
	"strings"
)

// generateID returns a 26-character base32 ID, as cocoon's utils.GenerateID does.
func generateID() string { return rand.Text() }

// minPrefixLen is the shortest ID prefix a ref may use.
const minPrefixLen = 3

// resolveRef resolves a VM or snapshot ref the way cocoon's utils.ResolveRef does: exact ID, then
// exact name, then a unique ID prefix of at least three characters.
func resolveRef[T any](items map[string]*T, names map[string]string, ref string, notFound error) (string, error) {
	if items[ref] != nil {
		return ref, nil
	}
	if id, ok := names[ref]; ok && items[id] != nil {
		return id, nil
	}
	if len(ref) >= minPrefixLen {
		var match string
		for id := range items {
			if strings.HasPrefix(id, ref) {
				if match != "" {
					return "", fmt.Errorf("ambiguous ref %q: multiple matches", ref)
				}
				match = id
			}
		}
		if match != "" {
			return match, nil
		}
	}
	return "", notFound
}

// resolveRefs resolves several refs, dropping duplicates; the first failure names its ref.
func resolveRefs[T any](items map[string]*T, names map[string]string, refs []string, notFound error) ([]string, error) {
	seen := map[string]bool{}
	var ids []string
	for _, ref := range refs {
		id, err := resolveRef(items, names, ref, notFound)
		if err != nil {
			return nil, fmt.Errorf("resolve %q: %w", ref, err)
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids, nil
}
