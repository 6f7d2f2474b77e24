// Package config fills a command's flags from the environment and an optional config file, so an
// operator can use whichever fits the deployment (systemd unit flags, an env file, a YAML file).
// A flag given on the command line wins, then the environment, then the file, then the default.
package config

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// EnvName is the environment variable that mirrors a flag: COCOON_CRI_STATE_DIR for --state-dir.
func EnvName(prefix, flag string) string {
	return prefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// Apply sets every flag not given on the command line from the environment (prefix + flag name in
// upper snake case) or, failing that, from the YAML file named by the flag configFlag, whose keys
// are the flag names. Unknown keys in the file are an error, so a typo does not go unnoticed.
func Apply(fs *pflag.FlagSet, envPrefix, configFlag string) error {
	fileValues, err := readFile(fs, envPrefix, configFlag)
	if err != nil {
		return err
	}
	for name := range fileValues {
		if fs.Lookup(name) == nil || name == configFlag {
			return fmt.Errorf("config file: unknown setting %q", name)
		}
	}
	var errs []string
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || f.Name == configFlag {
			return
		}
		value, ok := os.LookupEnv(EnvName(envPrefix, f.Name))
		source := EnvName(envPrefix, f.Name)
		if !ok {
			value, ok = fileValues[f.Name]
			source = "config file setting " + f.Name
		}
		if !ok {
			return
		}
		if err := fs.Set(f.Name, value); err != nil {
			errs = append(errs, fmt.Sprintf("%s=%q: %v", source, value, err))
		}
	})
	if len(errs) > 0 {
		sort.Strings(errs)
		return fmt.Errorf("invalid settings: %s", strings.Join(errs, "; "))
	}
	return nil
}

func readFile(fs *pflag.FlagSet, envPrefix, configFlag string) (map[string]string, error) {
	path := ""
	if f := fs.Lookup(configFlag); f != nil {
		path = f.Value.String()
		if !f.Changed {
			if env, ok := os.LookupEnv(EnvName(envPrefix, configFlag)); ok {
				path = env
			}
		}
	}
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	var raw map[string]any
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	values := make(map[string]string, len(raw))
	for k, v := range raw {
		switch v := v.(type) {
		case []any:
			parts := make([]string, len(v))
			for i, p := range v {
				parts[i] = fmt.Sprint(p)
			}
			values[k] = strings.Join(parts, ",")
		case map[string]any:
			// A map setting (KEY: VALUE lines) is given to its flag as KEY=VALUE,...; an empty one
			// leaves the default.
			if len(v) == 0 {
				continue
			}
			parts := make([]string, 0, len(v))
			for key, value := range v {
				parts = append(parts, fmt.Sprintf("%s=%v", key, value))
			}
			sort.Strings(parts)
			values[k] = strings.Join(parts, ",")
		default:
			values[k] = fmt.Sprint(v)
		}
	}
	return values, nil
}
