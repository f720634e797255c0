package wire

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/offheap"
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
	for _, s := range []error{krcore.ErrClosed, krcore.ErrNotConnected, krcore.ErrPortInUse, krcore.ErrNoRegion,
		krcore.ErrUnreachable, krcore.ErrRefused, verbs.ErrInvalid, verbs.ErrBusy, verbs.ErrLimit,
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
	if err := Wait(ctx, SpinFor, ready.Load, &flag, b, noStop); err != nil {
		t.Fatal(err)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel2()
	if err := Wait(short, SpinFor, func() bool { return false }, &flag, b, noStop); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait past its deadline: %v", err)
	}
}

// sameIdentity reports how got answers errors.Is and errors.As differently
// from want, for every sentinel that crosses, every WC status and the
// completion error.
func sameIdentity(want, got error) []string {
	var diff []string
	for _, s := range Sentinels() {
		if errors.Is(want, s) != errors.Is(got, s) {
			diff = append(diff, fmt.Sprintf("errors.Is(%v): %v, want %v", s, errors.Is(got, s), errors.Is(want, s)))
		}
	}
	for st := verbs.Success; st <= verbs.GeneralErr; st++ {
		if errors.Is(want, st) != errors.Is(got, st) {
			diff = append(diff, fmt.Sprintf("errors.Is(%v): %v, want %v", st, errors.Is(got, st), errors.Is(want, st)))
		}
	}
	var wce, gce *verbs.CompletionError
	if errors.As(want, &wce) != errors.As(got, &gce) || wce != nil && *wce != *gce {
		diff = append(diff, fmt.Sprintf("completion error %+v, want %+v", gce, wce))
	}
	return diff
}

// TestErrorIdentity: an error crosses the socket and the ring with its text
// and every sentinel, status and completion error it matches, joined and
// wrapped errors included.
func TestErrorIdentity(t *testing.T) {
	read := fmt.Errorf("READ of bucket 3 at 127.0.0.1:7000: %w", &verbs.CompletionError{ID: 9, QPN: 77, Status: verbs.RetryExcErr})
	for _, want := range []error{
		fmt.Errorf("core: connect to node 5: %w", fmt.Errorf("meta: fetch node 5: %w", read)),
		fmt.Errorf("core: connect to node 5: meta: fetch node 5: all 2 servers failed: %w",
			errors.Join(read, fmt.Errorf("hello 127.0.0.1:7001: %w", meta.ErrNoReply))),
		fmt.Errorf("core: connect to node 6: %w: %w", krcore.ErrUnreachable, fmt.Errorf("meta: fetch node 6: %w", meta.ErrNotFound)),
		fmt.Errorf("post: %w", verbs.RemAccessErr),
		fmt.Errorf("register: %w: %w", offheap.ErrNotSealed, verbs.ErrInvalid),
		errors.New("no sentinel at all"),
	} {
		m := NewMsg(OpConnect, 3).Fail(want)
		back, _ := Parse(m.Bytes(), nil)
		var r Ring
		r.mem = make([]byte, headerLen)
		r.PutCtlErr(want)
		for how, got := range map[string]error{"socket": back.Error(), "ring": r.CtlErr(ErrorCode(want))} {
			if !errors.Is(got, ErrRemote) || got.Error() != "krcored: "+want.Error() {
				t.Errorf("%s: %q, want krcored: %q", how, got, want)
			}
			for _, d := range sameIdentity(want, got) {
				t.Errorf("%s: %v: %s", how, want, d)
			}
		}
	}
	// A daemon of the first protocol sent the text alone: the code says
	// what it matched.
	old := NewMsg(OpConnect, 4)
	old.Code = CodeUnreachable
	old.Str("core: connect to node 6: node unreachable")
	back, _ := Parse(old.Bytes(), nil)
	if err := back.Error(); !errors.Is(err, krcore.ErrUnreachable) || !strings.Contains(err.Error(), "node 6") {
		t.Errorf("first protocol's error: %v", err)
	}
}
