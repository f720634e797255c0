// Package bounded runs a call that must not hang under a time bound, for
// tests: a call that does not return in time fails the test instead of
// blocking it until the test binary's timeout.
package bounded

import (
	"errors"
	"testing"
	"time"
)

// Within runs f and returns its error, failing t (t.Fatalf, so it is for
// the test's own goroutine) unless f returns within d; what names the call
// in the failure. A call that hangs is left running: the failure ends the
// test.
func Within(t testing.TB, d time.Duration, what string, f func() error) error {
	t.Helper()
	res := make(chan error, 1)
	go func() { res <- f() }()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case err := <-res:
		return err
	case <-timer.C:
		t.Fatalf("%s did not return within %v", what, d)
		return nil
	}
}

// AllFail fails t unless every result in res (a call's error by its name)
// arrives within d and matches target (errors.Is).
func AllFail(t testing.TB, d time.Duration, res map[string]chan error, target error) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for name, ch := range res {
		select {
		case err := <-ch:
			if !errors.Is(err, target) {
				t.Errorf("%s: %v, want %v", name, err, target)
			}
		case <-deadline.C:
			t.Fatalf("%s still waits %v after Close", name, d)
		}
	}
}
