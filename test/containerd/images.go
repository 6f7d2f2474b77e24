package containerdtest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// importImages builds the busybox and pause images as docker-archive tarballs and imports them
// with ctr into the CRI's namespace, where the kubelet's (and critest's) references find them.
func (d *Daemon) importImages() {
	d.t.Helper()
	busybox, err := busyboxLayer()
	if err != nil {
		d.t.Fatal(err)
	}
	pause, err := d.pauseLayer()
	if err != nil {
		d.t.Fatal(err)
	}
	images := []struct {
		ref    string
		layer  []byte
		config v1.Config
	}{
		{BusyboxImage, busybox, v1.Config{Cmd: []string{"sh"}, Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}},
		{PauseImage, pause, v1.Config{Entrypoint: []string{"/pause"}}},
	}
	for i, image := range images {
		file := filepath.Join(d.opts.Dir, fmt.Sprintf("image-%d.tar", i))
		if err := writeImage(file, image.ref, image.layer, image.config); err != nil {
			d.t.Fatalf("containerdtest: image %s: %v", image.ref, err)
		}
		if err := d.ctr("images", "import", "--platform", "linux/"+runtime.GOARCH, file); err != nil {
			d.t.Fatalf("containerdtest: %v", err)
		}
		if err := os.Remove(file); err != nil {
			d.t.Fatal(err)
		}
	}
}

// writeImage writes a one-layer image under ref as a docker-archive tarball, as `docker save`
// does.
func writeImage(file, ref string, layerTar []byte, config v1.Config) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar)), nil })
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", runtime.GOARCH, config
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	return tarball.MultiRefWriteToFile(file, map[name.Reference]v1.Image{tag: img})
}

// busyboxLayer is the host's static busybox with a link for every applet, the directories a
// container expects and the passwd and group entries of root and nobody.
func busyboxLayer() ([]byte, error) {
	const busybox = "/bin/busybox"
	binary, err := os.ReadFile(busybox)
	if err != nil {
		return nil, fmt.Errorf("busybox-static (hack/setup.sh installs it): %w", err)
	}
	list, err := exec.Command(busybox, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list-full: %w", busybox, err)
	}
	var layer layerWriter
	for _, d := range []string{"bin", "dev", "etc", "proc", "root", "sbin", "sys", "usr", "usr/bin", "usr/sbin", "var"} {
		layer.dir(d, 0o755)
	}
	layer.dir("tmp", 0o1777)
	layer.file("bin/busybox", binary, 0o755)
	layer.file("etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"), 0o644)
	layer.file("etc/group", []byte("root:x:0:\nnogroup:x:65534:\n"), 0o644)
	for _, applet := range strings.Fields(string(list)) {
		if applet != "bin/busybox" {
			layer.symlink(applet, "/bin/busybox")
		}
	}
	return layer.close()
}

// pauseLayer is test/cmd/pause, built statically.
func (d *Daemon) pauseLayer() ([]byte, error) {
	out := filepath.Join(d.opts.Dir, "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, "github.com/cocoonstack/cocoon-cri/test/cmd/pause")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build pause: %w: %s", err, msg)
	}
	binary, err := os.ReadFile(out)
	if err != nil {
		return nil, err
	}
	if err := os.Remove(out); err != nil {
		return nil, err
	}
	var layer layerWriter
	layer.file("pause", binary, 0o755)
	return layer.close()
}

// layerWriter writes a layer tar; the first error sticks and close reports it.
type layerWriter struct {
	buf bytes.Buffer
	tw  *tar.Writer
	err error
}

// layerTime is every entry's modification time, so a layer's digest depends on its content only.
var layerTime = time.Unix(1700000000, 0).UTC()

func (l *layerWriter) header(h *tar.Header, data []byte) {
	if l.err != nil {
		return
	}
	if l.tw == nil {
		l.tw = tar.NewWriter(&l.buf)
	}
	h.ModTime = layerTime
	if l.err = l.tw.WriteHeader(h); l.err == nil && len(data) > 0 {
		_, l.err = l.tw.Write(data)
	}
}

func (l *layerWriter) dir(name string, mode int64) {
	l.header(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode}, nil)
}

func (l *layerWriter) file(name string, data []byte, mode int64) {
	l.header(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: int64(len(data)), Mode: mode}, data)
}

func (l *layerWriter) symlink(name, target string) {
	l.header(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}, nil)
}

func (l *layerWriter) close() ([]byte, error) {
	if l.err == nil && l.tw != nil {
		l.err = l.tw.Close()
	}
	if l.err != nil {
		return nil, fmt.Errorf("write layer: %w", l.err)
	}
	return l.buf.Bytes(), nil
}
