//go:build race

package cocoonsim_test

// raceEnabled builds the simulator under test with the race detector too.
const raceEnabled = true
