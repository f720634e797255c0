package remotedev

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

func TestErrorRoundTrip(t *testing.T) {
	ce := &verbs.CompletionError{ID: 3, QPN: 9, Status: verbs.RetryExcErr}
	err := fmt.Errorf("outer: %w and %w", ce, fmt.Errorf("inner: %w (%w)", verbs.ErrInvalid, offheap.ErrNotOffHeap))
	got := encodeError(err).decode()
	if got.Error() != err.Error() {
		t.Errorf("text %q, want %q", got, err)
	}
	for _, want := range []error{verbs.ErrInvalid, offheap.ErrNotOffHeap, verbs.RetryExcErr} {
		if !errors.Is(got, want) {
			t.Errorf("decoded error does not match %v", want)
		}
	}
	for _, not := range []error{verbs.ErrClosed, verbs.RemAccessErr, context.Canceled} {
		if errors.Is(got, not) {
			t.Errorf("decoded error matches %v, which the original did not", not)
		}
	}
	var gce *verbs.CompletionError
	if !errors.As(got, &gce) || *gce != *ce {
		t.Errorf("CompletionError = %+v, want %+v", gce, ce)
	}
}

func TestErrorUnknownSentinelDropped(t *testing.T) {
	w := &wireError{Msg: "from a newer server", Sentinels: []string{"soft.ErrSomethingNew", "verbs.ErrLimit"}}
	got := w.decode()
	if !errors.Is(got, verbs.ErrLimit) || len(got.(*Error).Unwrap()) != 1 {
		t.Errorf("decoded %#v, want just ErrLimit", got)
	}
	if encodeError(nil) != nil || (*wireError)(nil).decode() != nil {
		t.Error("nil error does not stay nil")
	}
}
