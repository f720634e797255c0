package wire

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

func TestMsgRoundTrip(t *testing.T) {
	m := NewMsg(OpExport, 42).Str("table").U64(7).U32(9).U8(1)
	got, err := Parse(m.Bytes(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Op != OpExport || got.Seq != 42 || got.GetStr() != "table" || got.GetU64() != 7 || got.GetU32() != 9 || got.GetU8() != 1 || got.Err() != nil {
		t.Fatalf("round trip: %+v", got)
	}
	got.GetU64()
	if !errors.Is(got.Err(), ErrMalformed) {
		t.Errorf("reading past the body: %v", got.Err())
	}
	if _, err := Parse([]byte{1, 2}, nil); !errors.Is(err, ErrMalformed) {
		t.Errorf("short header: %v", err)
	}
}

// TestErrors: sentinels survive the trip, so errors.Is works on the client.
func TestErrors(t *testing.T) {
	for _, s := range []error{core.ErrClosed, core.ErrNotConnected, core.ErrPortInUse, core.ErrNoRegion,
		core.ErrUnreachable, core.ErrRefused, verbs.ErrInvalid, verbs.ErrBusy, verbs.ErrLimit,
		context.DeadlineExceeded, context.Canceled} {
		r := NewMsg(OpBind, 1).Fail(fmt.Errorf("bind: %w", s))
		back, _ := Parse(r.Bytes(), nil)
		if err := back.Error(); !errors.Is(err, s) || !errors.Is(err, ErrRemote) {
			t.Errorf("%v came back as %v", s, err)
		}
	}
	if NewMsg(OpBind, 1).Error() != nil {
		t.Error("success carries an error")
	}
}

// TestWait: a sleeper is woken by Notify, and ctx ends a sleep.
func TestWait(t *testing.T) {
	b, err := NewBell()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var flag atomic.Uint64
	var ready atomic.Bool
	go func() {
		time.Sleep(20 * time.Millisecond) // long enough that the waiter sleeps
		ready.Store(true)
		Notify(&flag, b)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	noStop := func() error { return nil }
	if err := Wait(ctx, ready.Load, &flag, b, noStop); err != nil {
		t.Fatal(err)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel2()
	if err := Wait(short, func() bool { return false }, &flag, b, noStop); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait past its deadline: %v", err)
	}
}
