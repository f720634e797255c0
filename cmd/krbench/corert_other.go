//go:build !linux

package main

import "time"

// crossCoreRTT needs thread affinity, which only the Linux build sets.
func crossCoreRTT(rounds, blocks int) (time.Duration, bool) { return 0, false }
