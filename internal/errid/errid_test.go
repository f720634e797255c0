package errid

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// TestRoundTrip: the rebuilt error has the original's text and answers
// errors.Is and errors.As as it did, for sentinels, a Status and a
// CompletionError nested in a tree of wraps, and no more.
func TestRoundTrip(t *testing.T) {
	ce := &verbs.CompletionError{ID: 3, QPN: 9, Status: verbs.RetryExcErr}
	err := fmt.Errorf("outer: %w and %w", ce, fmt.Errorf("inner: %w (%w)", verbs.ErrInvalid, offheap.ErrNotOffHeap))
	got := Capture(err).Err(err.Error())
	if got.Error() != err.Error() {
		t.Errorf("text %q, want %q", got, err)
	}
	for _, want := range []error{verbs.ErrInvalid, krcore.ErrInvalid, offheap.ErrNotOffHeap, verbs.RetryExcErr} {
		if !errors.Is(got, want) {
			t.Errorf("rebuilt error does not match %v", want)
		}
	}
	for _, not := range []error{verbs.ErrClosed, verbs.RemAccessErr, context.Canceled, krcore.ErrClosed} {
		if errors.Is(got, not) {
			t.Errorf("rebuilt error matches %v, which the original did not", not)
		}
	}
	var gce *verbs.CompletionError
	if !errors.As(got, &gce) || *gce != *ce || gce == ce {
		t.Errorf("CompletionError = %+v (%p), want a copy of %+v (%p)", gce, gce, ce, ce)
	}
}

// TestEverySentinelRoundTrips: each sentinel of the table, wrapped, comes
// back matching itself, and its name is its own.
func TestEverySentinelRoundTrips(t *testing.T) {
	seen := make(map[string]bool)
	for _, s := range sentinels {
		if seen[s.name] {
			t.Errorf("%s is in the table twice", s.name)
		}
		seen[s.name] = true
		id := Capture(fmt.Errorf("call: %w", s.err))
		if len(id.Sentinels) == 0 || id.Sentinels[0] != s.name && lookup(id.Sentinels[0]) != s.err {
			t.Errorf("%s captured as %v", s.name, id.Sentinels)
		}
		if got := id.Err("x"); !errors.Is(got, s.err) {
			t.Errorf("%s does not come back: %v", s.name, id.Sentinels)
		}
	}
}

// TestUnknownSentinelDropped: a name this build does not know (a newer
// build on the other side) is dropped, the rest kept; what Err is given
// besides is matched too.
func TestUnknownSentinelDropped(t *testing.T) {
	extra := errors.New("extra")
	id := Identity{Sentinels: []string{"soft.ErrSomethingNew", "verbs.ErrLimit"}}
	got := id.Err("from a newer build", extra)
	if !errors.Is(got, verbs.ErrLimit) || !errors.Is(got, extra) || len(got.(*Error).Unwrap()) != 2 {
		t.Errorf("rebuilt %#v, want extra and ErrLimit", got)
	}
	if id := Capture(nil); id.Sentinels != nil || id.HasStatus || id.Completion != nil {
		t.Errorf("Capture(nil) = %+v, want the zero Identity", id)
	}
}
