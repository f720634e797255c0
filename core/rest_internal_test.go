package core

import "time"

// Resting reports whether rt's receive waiter rests off the receive queue.
func Resting(rt *Runtime) bool { return rt.rest.resting.Load() }

// Sleepers is how many goroutines sleep in rt's waits.
func Sleepers(rt *Runtime) int32 { return rt.rest.sleepers.Load() }

// SetRestRound sets how long the receive waiter rests before it looks at
// the queue again, and returns the old value.
func SetRestRound(d time.Duration) time.Duration {
	old := restRound
	restRound = d
	return old
}
