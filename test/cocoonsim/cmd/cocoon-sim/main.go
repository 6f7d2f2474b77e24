// Command cocoon-sim is the cocoon simulator: a stand-in for the cocoon v0.3.8 CLI used by
// cocoon-cri's tests and demos on machines where cocoon cannot run. Install it as "cocoon" (or
// point cocoon-cri at it) and give it the same --root-dir/--run-dir/--log-dir as cocoon.
package main

import (
	"os"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
)

func main() {
	os.Exit(cocoonsim.Main(os.Args[1:]))
}
