//go:build race

package drivertest

// raceDetector reports whether the race detector is on.
const raceDetector = true
