package realguest

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// moduleIndex is what depmod knows about one kernel: each loadable module's path (relative to
// lib/modules/<version>) with its dependencies, and the modules built into the image.
type moduleIndex struct {
	deps    map[string][]string // path -> paths it needs, as modules.dep lists them
	paths   map[string]string   // module name -> path
	builtin map[string]bool     // module name -> built into the kernel image
}

// moduleName is how modprobe names a module: the file name without .ko (and any compression
// suffix), dashes folded to underscores.
func moduleName(path string) string {
	base := filepath.Base(path)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "_")
}

func readModuleIndex(modulesDir string) (*moduleIndex, error) {
	idx := &moduleIndex{deps: map[string][]string{}, paths: map[string]string{}, builtin: map[string]bool{}}
	err := readLines(filepath.Join(modulesDir, "modules.dep"), func(line string) error {
		path, deps, ok := strings.Cut(line, ":")
		if !ok {
			return fmt.Errorf("malformed line %q", line)
		}
		idx.deps[path] = strings.Fields(deps)
		idx.paths[moduleName(path)] = path
		return nil
	})
	if err != nil {
		return nil, err
	}
	// A kernel without modules.builtin simply has nothing built in that we ask for.
	err = readLines(filepath.Join(modulesDir, "modules.builtin"), func(line string) error {
		idx.builtin[moduleName(line)] = true
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	return idx, nil
}

// loadOrder returns the module files to insmod, in order, for the named modules: every
// dependency before the modules that need it, each once. Built-in modules need no file.
func (idx *moduleIndex) loadOrder(names []string) ([]string, error) {
	var order []string
	seen := map[string]bool{}
	var visit func(path, neededBy string) error
	visit = func(path, neededBy string) error {
		if seen[path] {
			return nil
		}
		deps, ok := idx.deps[path]
		if !ok {
			return fmt.Errorf("%s needs %s, which modules.dep does not list", neededBy, path)
		}
		seen[path] = true
		// modules.dep lists the deepest dependencies last; visiting every one first keeps the
		// order right however it is listed.
		for _, dep := range deps {
			if err := visit(dep, moduleName(path)); err != nil {
				return err
			}
		}
		order = append(order, path)
		return nil
	}
	for _, name := range names {
		if idx.builtin[name] {
			continue
		}
		path, ok := idx.paths[name]
		if !ok {
			return nil, fmt.Errorf("kernel module %s is neither built in nor in modules.dep", name)
		}
		if err := visit(path, name); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// readLines calls fn with each non-empty line of a file.
func readLines(path string, fn func(line string) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open module index: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if err := fn(line); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	return nil
}
