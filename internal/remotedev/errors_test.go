package remotedev

import (
	"bytes"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// TestErrorRoundTrip: an error in a response survives gob with its text,
// its sentinels (the root package's too), Status and CompletionError, and
// matches nothing more.
func TestErrorRoundTrip(t *testing.T) {
	ce := &verbs.CompletionError{ID: 3, QPN: 9, Status: verbs.RetryExcErr}
	err := fmt.Errorf("outer: %w and %w", ce, fmt.Errorf("inner: %w (%w, %w)", verbs.ErrInvalid, offheap.ErrNotOffHeap, krcore.ErrPeerDead))
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(&response{Seq: 1, Err: encodeError(err)}); err != nil {
		t.Fatal(err)
	}
	var resp response
	if err := gob.NewDecoder(&buf).Decode(&resp); err != nil {
		t.Fatal(err)
	}
	got := resp.Err.decode()
	if got.Error() != err.Error() {
		t.Errorf("text %q, want %q", got, err)
	}
	for _, want := range []error{verbs.ErrInvalid, offheap.ErrNotOffHeap, krcore.ErrPeerDead, verbs.RetryExcErr} {
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

// TestErrorNil: no error stays no error both ways.
func TestErrorNil(t *testing.T) {
	if encodeError(nil) != nil || (*wireError)(nil).decode() != nil {
		t.Error("nil error does not stay nil")
	}
}
