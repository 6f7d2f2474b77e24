package guest

import (
	"fmt"
	"strconv"
	"strings"
)

// VMConfig is the part of Cloud Hypervisor's VM configuration that cocoon writes and reads: it is
// what `GET vm.info` returns under "config" and what `vm.snapshot` saves as config.json. The JSON
// keys are Cloud Hypervisor's.
type VMConfig struct {
	Payload  *Payload     `json:"payload,omitempty"`
	Balloon  *Balloon     `json:"balloon,omitempty"`
	Serial   *RuntimeFile `json:"serial,omitempty"`
	Console  *RuntimeFile `json:"console,omitempty"`
	CPUs     CPUs         `json:"cpus"`
	Memory   Memory       `json:"memory"`
	Disks    []Disk       `json:"disks,omitempty"`
	Nets     []Net        `json:"net,omitempty"`
	Fs       []Fs         `json:"fs,omitempty"`
	Devices  []Device     `json:"devices,omitempty"`
	RNG      RNG          `json:"rng"`
	Watchdog bool         `json:"watchdog"`
}

// Payload is what the VM boots: a kernel (direct boot, OCI images) or firmware (UEFI, cloud images).
type Payload struct {
	Firmware  string `json:"firmware,omitempty"`
	Kernel    string `json:"kernel,omitempty"`
	Initramfs string `json:"initramfs,omitempty"`
	Cmdline   string `json:"cmdline,omitempty"`
}

// CPUs is the vCPU configuration.
type CPUs struct {
	BootVCPUs int  `json:"boot_vcpus"`
	MaxVCPUs  int  `json:"max_vcpus"`
	KVMHyperV bool `json:"kvm_hyperv,omitempty"`
}

// Memory is the guest memory configuration.
type Memory struct {
	Size      int64 `json:"size"`
	HugePages bool  `json:"hugepages,omitempty"`
	// Shared maps guest RAM MAP_SHARED, which vhost-user devices (virtio-fs) need.
	Shared bool `json:"shared,omitempty"`
}

// Disk is one virtio-blk device.
type Disk struct {
	ID           string `json:"id,omitempty"`
	Path         string `json:"path"`
	ReadOnly     bool   `json:"readonly,omitempty"`
	DirectIO     bool   `json:"direct,omitempty"`
	Sparse       bool   `json:"sparse,omitempty"`
	ImageType    string `json:"image_type,omitempty"`
	BackingFiles bool   `json:"backing_files,omitempty"`
	NumQueues    int    `json:"num_queues,omitempty"`
	QueueSize    int    `json:"queue_size,omitempty"`
	Serial       string `json:"serial,omitempty"`
}

// Net is one virtio-net device.
type Net struct {
	ID          string `json:"id,omitempty"`
	Tap         string `json:"tap"`
	Mac         string `json:"mac,omitempty"`
	NumQueues   int    `json:"num_queues,omitempty"`
	QueueSize   int    `json:"queue_size,omitempty"`
	OffloadTSO  bool   `json:"offload_tso,omitempty"`
	OffloadUFO  bool   `json:"offload_ufo,omitempty"`
	OffloadCsum bool   `json:"offload_csum,omitempty"`
}

// Balloon is the virtio-balloon device.
type Balloon struct {
	ID                string `json:"id,omitempty"`
	Size              int64  `json:"size"`
	DeflateOnOOM      bool   `json:"deflate_on_oom,omitempty"`
	FreePageReporting bool   `json:"free_page_reporting,omitempty"`
}

// RNG is the entropy source.
type RNG struct {
	Src string `json:"src"`
}

// RuntimeFile is a serial or console device: Mode is "Off", "Pty", "Tty", "Null", "File" or
// "Socket". For a PTY, File is filled in by the hypervisor with the slave path once allocated.
type RuntimeFile struct {
	Mode   string `json:"mode"`
	File   string `json:"file,omitempty"`
	Socket string `json:"socket,omitempty"`
}

// Console modes the simulator acts on.
const (
	ModeOff    = "Off"
	ModePty    = "Pty"
	ModeSocket = "Socket"
	// ModeTty is the hypervisor's own stdin and stdout, where Firecracker puts the guest's serial
	// port (cocoon hands it a PTY and relays it to console.sock).
	ModeTty = "Tty"
)

// Args renders cfg as cloud-hypervisor command-line arguments, the way cocoon launches CH.
func (cfg *VMConfig) Args(apiSocket string) []string {
	args := []string{"--api-socket", apiSocket}
	cpus := fmt.Sprintf("boot=%d,max=%d", cfg.CPUs.BootVCPUs, cfg.CPUs.MaxVCPUs)
	if cfg.CPUs.KVMHyperV {
		cpus += ",kvm_hyperv=on"
	}
	args = append(args, "--cpus", cpus)
	mem := fmt.Sprintf("size=%d", cfg.Memory.Size)
	if cfg.Memory.HugePages {
		mem += ",hugepages=on"
	}
	if cfg.Memory.Shared {
		mem += ",shared=on"
	}
	args = append(args, "--memory", mem)
	if len(cfg.Disks) > 0 {
		args = append(args, "--disk")
		for _, d := range cfg.Disks {
			args = append(args, d.arg())
		}
	}
	if p := cfg.Payload; p != nil {
		args = appendIf(args, p.Kernel != "", "--kernel", p.Kernel)
		args = appendIf(args, p.Firmware != "", "--firmware", p.Firmware)
		args = appendIf(args, p.Initramfs != "", "--initramfs", p.Initramfs)
		args = appendIf(args, p.Cmdline != "", "--cmdline", p.Cmdline)
	}
	if len(cfg.Nets) > 0 {
		args = append(args, "--net")
		for _, n := range cfg.Nets {
			args = append(args, n.arg())
		}
	}
	args = append(args, "--rng", "src="+cfg.RNG.Src)
	if cfg.Watchdog {
		args = append(args, "--watchdog")
	}
	if b := cfg.Balloon; b != nil {
		args = append(args, "--balloon", b.arg())
	}
	if cfg.Serial != nil {
		args = append(args, "--serial", cfg.Serial.arg())
	}
	if cfg.Console != nil {
		args = append(args, "--console", cfg.Console.arg())
	}
	return args
}

// ParseArgs reads back what Args rendered: the API socket path and, when the arguments describe a
// VM (a payload was given), its configuration. A hypervisor started with only --api-socket has no
// VM until vm.restore, so cfg is nil then.
func ParseArgs(args []string) (apiSocket string, cfg *VMConfig, err error) {
	parsed := &VMConfig{}
	hasVM := false
	for i := 0; i < len(args); i++ {
		flag := args[i]
		var values []string
		for i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			i++
			values = append(values, args[i])
		}
		if err := parsed.apply(flag, values, &apiSocket); err != nil {
			return "", nil, fmt.Errorf("%s: %w", flag, err)
		}
		if flag == "--kernel" || flag == "--firmware" {
			hasVM = true
		}
	}
	if apiSocket == "" {
		return "", nil, fmt.Errorf("--api-socket is required")
	}
	if hasVM {
		cfg = parsed
	}
	return apiSocket, cfg, nil
}

func (cfg *VMConfig) apply(flag string, values []string, apiSocket *string) error {
	single := func() (string, error) {
		if len(values) != 1 {
			return "", fmt.Errorf("want one value, got %d", len(values))
		}
		return values[0], nil
	}
	payload := func() *Payload {
		if cfg.Payload == nil {
			cfg.Payload = &Payload{}
		}
		return cfg.Payload
	}
	var err error
	switch flag {
	case "--api-socket":
		*apiSocket, err = single()
	case "--cpus":
		err = eachKV(values, func(k, v string) error {
			switch k {
			case "boot":
				return atoi(v, &cfg.CPUs.BootVCPUs)
			case "max":
				return atoi(v, &cfg.CPUs.MaxVCPUs)
			case "kvm_hyperv":
				cfg.CPUs.KVMHyperV = v == "on"
			}
			return nil
		})
	case "--memory":
		err = eachKV(values, func(k, v string) error {
			switch k {
			case "size":
				return atoi64(v, &cfg.Memory.Size)
			case "hugepages":
				cfg.Memory.HugePages = v == "on"
			case "shared":
				cfg.Memory.Shared = v == "on"
			}
			return nil
		})
	case "--disk":
		for _, v := range values {
			d, parseErr := parseDisk(v)
			if parseErr != nil {
				return parseErr
			}
			cfg.Disks = append(cfg.Disks, d)
		}
	case "--net":
		for _, v := range values {
			n, parseErr := parseNet(v)
			if parseErr != nil {
				return parseErr
			}
			cfg.Nets = append(cfg.Nets, n)
		}
	case "--kernel":
		payload().Kernel, err = single()
	case "--firmware":
		payload().Firmware, err = single()
	case "--initramfs":
		payload().Initramfs, err = single()
	case "--cmdline":
		payload().Cmdline, err = single()
	case "--rng":
		err = eachKV(values, func(k, v string) error {
			if k == "src" {
				cfg.RNG.Src = v
			}
			return nil
		})
	case "--watchdog":
		cfg.Watchdog = true
	case "--balloon":
		cfg.Balloon = &Balloon{}
		err = eachKV(values, func(k, v string) error {
			switch k {
			case "size":
				return atoi64(v, &cfg.Balloon.Size)
			case "deflate_on_oom":
				cfg.Balloon.DeflateOnOOM = v == "on"
			case "free_page_reporting":
				cfg.Balloon.FreePageReporting = v == "on"
			}
			return nil
		})
	case "--serial":
		var v string
		if v, err = single(); err == nil {
			cfg.Serial = parseRuntimeFile(v)
		}
	case "--console":
		var v string
		if v, err = single(); err == nil {
			cfg.Console = parseRuntimeFile(v)
		}
	default:
		return fmt.Errorf("unknown argument")
	}
	return err
}

func (d Disk) arg() string {
	kv := []string{"path=" + d.Path}
	kv = appendIf(kv, d.ReadOnly, "readonly=on")
	kv = appendIf(kv, d.DirectIO, "direct=on")
	kv = appendIf(kv, d.Sparse, "sparse=on")
	kv = appendIf(kv, d.ImageType != "", "image_type="+strings.ToLower(d.ImageType))
	kv = appendIf(kv, d.BackingFiles, "backing_files=on")
	kv = appendIf(kv, d.NumQueues > 0, fmt.Sprintf("num_queues=%d", d.NumQueues))
	kv = appendIf(kv, d.QueueSize > 0, fmt.Sprintf("queue_size=%d", d.QueueSize))
	kv = appendIf(kv, d.Serial != "", "serial="+d.Serial)
	return strings.Join(kv, ",")
}

func parseDisk(s string) (Disk, error) {
	var d Disk
	err := eachKV([]string{s}, func(k, v string) error {
		switch k {
		case "path":
			d.Path = v
		case "readonly":
			d.ReadOnly = v == "on"
		case "direct":
			d.DirectIO = v == "on"
		case "sparse":
			d.Sparse = v == "on"
		case "image_type":
			d.ImageType = map[string]string{"raw": "Raw", "qcow2": "Qcow2"}[v]
		case "backing_files":
			d.BackingFiles = v == "on"
		case "num_queues":
			return atoi(v, &d.NumQueues)
		case "queue_size":
			return atoi(v, &d.QueueSize)
		case "serial":
			d.Serial = v
		}
		return nil
	})
	return d, err
}

func (n Net) arg() string {
	kv := []string{"tap=" + n.Tap}
	kv = appendIf(kv, n.Mac != "", "mac="+n.Mac)
	kv = appendIf(kv, n.NumQueues > 0, fmt.Sprintf("num_queues=%d", n.NumQueues))
	kv = appendIf(kv, n.QueueSize > 0, fmt.Sprintf("queue_size=%d", n.QueueSize))
	kv = appendIf(kv, n.OffloadTSO, "offload_tso=on")
	kv = appendIf(kv, n.OffloadUFO, "offload_ufo=on")
	kv = appendIf(kv, n.OffloadCsum, "offload_csum=on")
	return strings.Join(kv, ",")
}

func parseNet(s string) (Net, error) {
	var n Net
	err := eachKV([]string{s}, func(k, v string) error {
		switch k {
		case "tap":
			n.Tap = v
		case "mac":
			n.Mac = v
		case "num_queues":
			return atoi(v, &n.NumQueues)
		case "queue_size":
			return atoi(v, &n.QueueSize)
		case "offload_tso":
			n.OffloadTSO = v == "on"
		case "offload_ufo":
			n.OffloadUFO = v == "on"
		case "offload_csum":
			n.OffloadCsum = v == "on"
		}
		return nil
	})
	return n, err
}

func (b Balloon) arg() string {
	kv := []string{fmt.Sprintf("size=%d", b.Size)}
	kv = appendIf(kv, b.DeflateOnOOM, "deflate_on_oom=on")
	kv = appendIf(kv, b.FreePageReporting, "free_page_reporting=on")
	return strings.Join(kv, ",")
}

func (r RuntimeFile) arg() string {
	switch strings.ToLower(r.Mode) {
	case "file":
		return "file=" + r.File
	case "socket":
		return "socket=" + r.Socket
	default:
		return strings.ToLower(r.Mode)
	}
}

func parseRuntimeFile(s string) *RuntimeFile {
	if path, ok := strings.CutPrefix(s, "socket="); ok {
		return &RuntimeFile{Mode: ModeSocket, Socket: path}
	}
	if path, ok := strings.CutPrefix(s, "file="); ok {
		return &RuntimeFile{Mode: "File", File: path}
	}
	if s == "" {
		return &RuntimeFile{Mode: ModeOff}
	}
	return &RuntimeFile{Mode: strings.ToUpper(s[:1]) + s[1:]}
}

func eachKV(values []string, fn func(k, v string) error) error {
	for _, value := range values {
		for part := range strings.SplitSeq(value, ",") {
			k, v, _ := strings.Cut(part, "=")
			if err := fn(k, v); err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
		}
	}
	return nil
}

func atoi(s string, dst *int) error {
	n, err := strconv.Atoi(s)
	*dst = n
	return err
}

func atoi64(s string, dst *int64) error {
	n, err := strconv.ParseInt(s, 10, 64)
	*dst = n
	return err
}

func appendIf(list []string, cond bool, items ...string) []string {
	if cond {
		return append(list, items...)
	}
	return list
}
