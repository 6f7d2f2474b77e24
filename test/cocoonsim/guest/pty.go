package guest

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// ptyConsole is the virtio-console PTY that cloud-hypervisor allocates for direct-boot (OCI) VMs.
// Its slave path is reported only through vm.info's config.console.file.
type ptyConsole struct {
	master *os.File
	// slave stays open for the life of the hypervisor so output written before anyone attaches is
	// kept in the tty buffer (bounded by the kernel) instead of being lost on hang-up.
	slave *os.File
	path  string
}

// openPTY allocates a PTY pair and puts the slave side in raw mode, so bytes reach a reader
// unchanged and the host's tty layer echoes nothing: the guest's own tty does (see console).
// What is written to the slave is handed to typed.
func openPTY(typed func([]byte)) (*ptyConsole, error) {
	master, slave, err := OpenPTYPair()
	if err != nil {
		return nil, err
	}
	path := slave.Name()
	if err := control(slave, makeRaw); err != nil {
		_ = master.Close()
		_ = slave.Close()
		return nil, fmt.Errorf("raw mode on %s: %w", path, err)
	}
	p := &ptyConsole{master: master, slave: slave, path: path}
	// Input is always read, so a writer attached to the slave never blocks.
	go readTyped(master, typed)
	return p, nil
}

// readTyped hands what arrives on a console device to typed until the device fails.
func readTyped(f *os.File, typed func([]byte)) {
	buf := make([]byte, 4096)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			typed(buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// OpenPTYPair allocates a PTY and opens both sides; the slave is named by its path.
func OpenPTYPair() (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	var ptyNum int
	if err := control(master, func(fd int) error {
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return fmt.Errorf("unlock pty: %w", err)
		}
		n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
		ptyNum = n
		return err
	}); err != nil {
		_ = master.Close()
		return nil, nil, err
	}
	path := fmt.Sprintf("/dev/pts/%d", ptyNum)
	slave, err = os.OpenFile(path, os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		_ = master.Close()
		return nil, nil, fmt.Errorf("open %s: %w", path, err)
	}
	return master, slave, nil
}

// Write sends guest output to whoever reads the slave.
func (p *ptyConsole) Write(b []byte) (int, error) { return p.master.Write(b) }

func makeRaw(fd int) error {
	t, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return err
	}
	t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	t.Oflag &^= unix.OPOST
	t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	t.Cflag &^= unix.CSIZE | unix.PARENB
	t.Cflag |= unix.CS8
	t.Cc[unix.VMIN] = 1
	t.Cc[unix.VTIME] = 0
	return unix.IoctlSetTermios(fd, unix.TCSETS, t)
}

// control runs fn on f's descriptor without switching f to blocking mode (as f.Fd() would).
func control(f *os.File, fn func(fd int) error) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var fnErr error
	if err := raw.Control(func(fd uintptr) { fnErr = fn(int(fd)) }); err != nil {
		return err
	}
	return fnErr
}
