package cocoonsim

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// Config is cocoon's global configuration (config/config.go): the same keys, defaults and
// validation messages.
type Config struct {
	RootDir                     string
	RunDir                      string
	LogDir                      string
	CHBinary                    string
	FCBinary                    string
	StopTimeoutSeconds          int
	PoolSize                    int
	CNIConfDir                  string
	CNIBinDir                   string
	DNS                         string
	SocketWaitTimeoutSeconds    int
	TerminateGracePeriodSeconds int
	Log                         LogConfig
}

// LogConfig is projecteru2/core's ServerLogConfig, the "log" section of the config file.
type LogConfig struct {
	Level    string
	UseJSON  bool
	Filename string
}

// configDefaults are viper's SetDefault values in cocoon's cmd/root.go.
var configDefaults = map[string]string{
	"root_dir":             "/var/lib/cocoon",
	"run_dir":              "/var/lib/cocoon/run",
	"log_dir":              "/var/log/cocoon",
	"ch_binary":            "cloud-hypervisor",
	"fc_binary":            "firecracker",
	"cni_conf_dir":         "/etc/cni/net.d",
	"cni_bin_dir":          "/opt/cni/bin",
	"dns":                  "8.8.8.8,1.1.1.1",
	"stop_timeout_seconds": "30",
	"log.level":            "info",
}

// flagKeys maps the persistent flags to the config keys they override.
var flagKeys = map[string]string{
	"root-dir":     "root_dir",
	"run-dir":      "run_dir",
	"log-dir":      "log_dir",
	"cni-conf-dir": "cni_conf_dir",
	"cni-bin-dir":  "cni_bin_dir",
	"dns":          "dns",
	"log-level":    "log.level",
}

// loadConfig resolves every key the way viper does for cocoon: a flag that was set, then the
// COCOON_<KEY> environment variable, then the config file, then the default. Nested keys
// ("log.level") have no usable environment variable, which is why COCOON_LOG_LEVEL is ignored.
func loadConfig(flags *pflag.FlagSet, cfgFile string) (*Config, error) {
	file, err := readConfigFile(cfgFile)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	byFlag := map[string]string{}
	flags.Visit(func(f *pflag.Flag) {
		if key, ok := flagKeys[f.Name]; ok {
			byFlag[key] = f.Value.String()
		}
	})
	get := func(key string) (string, bool) {
		if v, ok := byFlag[key]; ok {
			return v, true
		}
		if !strings.Contains(key, ".") {
			if v, ok := os.LookupEnv("COCOON_" + strings.ToUpper(key)); ok {
				return v, true
			}
		}
		if v, ok := file[key]; ok {
			return v, true
		}
		v, ok := configDefaults[key]
		return v, ok
	}
	str := func(key string) string { v, _ := get(key); return v }

	conf := &Config{
		RootDir:    str("root_dir"),
		RunDir:     str("run_dir"),
		LogDir:     str("log_dir"),
		CHBinary:   str("ch_binary"),
		FCBinary:   str("fc_binary"),
		CNIConfDir: str("cni_conf_dir"),
		CNIBinDir:  str("cni_bin_dir"),
		DNS:        str("dns"),
		Log:        LogConfig{Level: str("log.level"), Filename: str("log.filename")},
	}
	var parseErrs []string
	for key, dst := range map[string]*int{
		"stop_timeout_seconds":           &conf.StopTimeoutSeconds,
		"pool_size":                      &conf.PoolSize,
		"socket_wait_timeout_seconds":    &conf.SocketWaitTimeoutSeconds,
		"terminate_grace_period_seconds": &conf.TerminateGracePeriodSeconds,
	} {
		if v, ok := get(key); ok && v != "" {
			n, convErr := strconv.Atoi(v)
			if convErr != nil {
				parseErrs = append(parseErrs, fmt.Sprintf("cannot parse '%s' as int: %v", key, convErr))
			}
			*dst = n
		}
	}
	if v, ok := get("log.usejson"); ok && v != "" {
		b, convErr := strconv.ParseBool(v)
		if convErr != nil {
			parseErrs = append(parseErrs, fmt.Sprintf("cannot parse 'log.usejson' as bool: %v", convErr))
		}
		conf.Log.UseJSON = b
	}
	if len(parseErrs) > 0 {
		return nil, fmt.Errorf("parse config: %s", strings.Join(parseErrs, "; "))
	}
	if conf.PoolSize == 0 {
		conf.PoolSize = runtime.NumCPU()
	}
	if err := conf.validate(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return conf, nil
}

// readConfigFile flattens a YAML or JSON config file into lower-case dotted keys ("log.usejson").
func readConfigFile(path string) (map[string]string, error) {
	out := map[string]string{}
	if path == "" {
		return out, nil
	}
	switch ext := strings.TrimPrefix(filepath.Ext(path), "."); ext {
	case "yaml", "yml", "json":
	default:
		//lint:ignore ST1005 viper's exact text
		return nil, fmt.Errorf("Unsupported Config Type %q", ext)
	}
	data, err := os.ReadFile(path) //nolint:gosec // operator-supplied config path
	if err != nil {
		return nil, err
	}
	var tree map[string]any
	if err := yaml.Unmarshal(data, &tree); err != nil {
		//lint:ignore ST1005 viper's exact text
		return nil, fmt.Errorf("While parsing config: %w", err)
	}
	flatten("", tree, out)
	return out, nil
}

func flatten(prefix string, tree map[string]any, out map[string]string) {
	for k, v := range tree {
		key := strings.ToLower(k)
		if prefix != "" {
			key = prefix + "." + key
		}
		switch val := v.(type) {
		case map[string]any:
			flatten(key, val, out)
		case nil:
		case float64:
			out[key] = strconv.FormatFloat(val, 'f', -1, 64)
		default:
			out[key] = fmt.Sprint(val)
		}
	}
}

func (c *Config) validate() error {
	if c.RootDir == "" {
		return fmt.Errorf("root_dir must not be empty")
	}
	if c.RunDir == "" {
		return fmt.Errorf("run_dir must not be empty")
	}
	if c.LogDir == "" {
		return fmt.Errorf("log_dir must not be empty")
	}
	if c.StopTimeoutSeconds <= 0 {
		return fmt.Errorf("stop_timeout_seconds must be > 0, got %d", c.StopTimeoutSeconds)
	}
	if _, err := c.dnsServers(); err != nil {
		return fmt.Errorf("dns: %w", err)
	}
	return nil
}

// dnsServers splits the DNS setting on "," or ";" and checks every entry is an IP address.
func (c *Config) dnsServers() ([]string, error) {
	var servers []string
	for s := range strings.SplitSeq(strings.ReplaceAll(c.DNS, ";", ","), ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if net.ParseIP(s) == nil {
			return nil, fmt.Errorf("invalid DNS server address %q", s)
		}
		servers = append(servers, s)
	}
	return servers, nil
}

// stopTimeoutForce is the StopTimeoutSeconds value --force sets: skip the graceful path.
const stopTimeoutForce = -1

func (c *Config) socketWaitTimeoutSeconds() int {
	if c.SocketWaitTimeoutSeconds > 0 {
		return c.SocketWaitTimeoutSeconds
	}
	return 5
}

func (c *Config) terminateGraceSeconds() int {
	if c.TerminateGracePeriodSeconds > 0 {
		return c.TerminateGracePeriodSeconds
	}
	return 5
}
