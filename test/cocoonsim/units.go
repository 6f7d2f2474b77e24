package cocoonsim

import (
	"fmt"
	"strconv"
	"strings"
)

// Size parsing and printing as docker/go-units v0.5.0 does it (cocoon parses --memory, --storage
// and --data-disk with RAMInBytes and prints sizes with HumanSize and BytesSize). Error texts are
// go-units' own, since cocoon wraps and prints them.

var binaryMultipliers = map[byte]int64{
	'k': 1 << 10, 'm': 1 << 20, 'g': 1 << 30, 't': 1 << 40, 'p': 1 << 50,
}

// ramInBytes parses "512M", "2g", "1.5GiB", "1024" (bytes) with binary multipliers.
func ramInBytes(s string) (int64, error) {
	sep := strings.LastIndexAny(s, "01234567890. ")
	if sep == -1 {
		return -1, fmt.Errorf("invalid size: '%s'", s)
	}
	num, suffix := s[:sep+1], s[sep+1:]
	if s[sep] == ' ' {
		num = s[:sep]
	}
	size, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return -1, err
	}
	if size < 0 {
		return -1, fmt.Errorf("invalid size: '%s'", s)
	}
	if suffix == "" {
		return int64(size), nil
	}
	if len(suffix) > 3 {
		return -1, fmt.Errorf("invalid suffix: '%s'", suffix)
	}
	suffix = strings.ToLower(suffix)
	if suffix[0] == 'b' {
		if len(suffix) > 1 {
			return -1, fmt.Errorf("invalid suffix: '%s'", suffix)
		}
		return int64(size), nil
	}
	mul, ok := binaryMultipliers[suffix[0]]
	if !ok || (len(suffix) == 2 && suffix[1] != 'b') || (len(suffix) == 3 && suffix[1:] != "ib") {
		return -1, fmt.Errorf("invalid suffix: '%s'", suffix)
	}
	return int64(size * float64(mul)), nil
}

// humanSize prints a size with decimal units ("536.9MB"), like go-units HumanSize.
func humanSize(bytes int64) string {
	return scaledSize(float64(bytes), 1000, []string{"B", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"})
}

// bytesSize prints a size with binary units ("512MiB"), like go-units BytesSize.
func bytesSize(bytes int64) string {
	return scaledSize(float64(bytes), 1024, []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"})
}

func scaledSize(size, base float64, units []string) string {
	i := 0
	for size >= base && i < len(units)-1 {
		size /= base
		i++
	}
	return fmt.Sprintf("%.4g%s", size, units[i])
}
