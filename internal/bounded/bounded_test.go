package bounded_test

import (
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/bounded"
)

// fatalRecorder records a Fatalf instead of ending the test.
type fatalRecorder struct {
	testing.TB
	failed bool
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(string, ...any) { r.failed = true }

func TestWithin(t *testing.T) {
	errX := errors.New("x")
	if err := bounded.Within(t, time.Second, "quick", func() error { return errX }); err != errX {
		t.Errorf("quick call: %v, want its own error", err)
	}
	r := &fatalRecorder{TB: t}
	stop := make(chan struct{})
	defer close(stop)
	bounded.Within(r, 10*time.Millisecond, "hang", func() error { <-stop; return nil })
	if !r.failed {
		t.Error("a call past its bound did not fail the test")
	}
}
