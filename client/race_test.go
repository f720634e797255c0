//go:build race

package client_test

// raceOn: the race detector slows every READ several times.
const raceOn = true
