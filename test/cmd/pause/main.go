// Command pause is the sandbox process of the test containerd's pods, as registry.k8s.io/pause is
// on a real node: it holds the pod's namespaces, reaps the orphans of a shared PID namespace and
// exits at SIGINT or SIGTERM. The tests build it statically into their pause image; no registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
