//go:build race

package lite_test

// raceOn: the race detector slows every operation several times and
// unevenly, so latency ratios under it say nothing about the code.
const raceOn = true
