//go:build !race

package cocoonsim_test

const raceEnabled = false
