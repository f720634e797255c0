package krcore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/testcluster"
	"github.com/krcore/krcore/verbs"
)

// TestPopAnyWait runs VQ.PopAnyWait embedded and through krcored: it
// returns a completion when only a completion comes, a message when only a
// message comes (the waiter asleep first), both when both are there,
// honours its context, refuses an empty call, and Close wakes it with
// ErrClosed.
func TestPopAnyWait(t *testing.T) {
	others, apis := testcluster.APIs(t, 2)
	peer := others[0] // node 2, embedded
	for name, api := range apis {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			q, echo := popAnyPair(t, ctx, api, peer)
			mr, err := api.RegMR(256, verbs.AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			defer api.Deregister(mr)
			if err := q.PushRecv(mr.Range(0, 64), mr.Range(64, 64)); err != nil {
				t.Fatal(err)
			}
			var out [2]krcore.Completion
			var msgs [2]krcore.Message

			if _, _, err := q.PopAnyWait(ctx, nil, nil); !errors.Is(err, krcore.ErrInvalid) {
				t.Fatalf("empty PopAnyWait: %v, want ErrInvalid", err)
			}
			short, stop := context.WithTimeout(ctx, 20*time.Millisecond)
			_, _, err = q.PopAnyWait(short, out[:], msgs[:])
			stop()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("PopAnyWait with nothing to come: %v, want DeadlineExceeded", err)
			}

			// A completion alone, of a request pushed while the waiter
			// sleeps (a SEND to the peer, which does not answer); then a
			// message alone, sent while it sleeps.
			type res struct {
				nc, nm int
				err    error
			}
			done := make(chan res, 1)
			wait := func() {
				go func() {
					nc, nm, err := q.PopAnyWait(ctx, out[:], msgs[:])
					done <- res{nc, nm, err}
				}()
				time.Sleep(10 * time.Millisecond) // let it fall asleep: the wake-up is under test
			}
			wait()
			copy(mr.Bytes()[128:], "ping")
			if _, err := q.Push(ctx, true, krcore.Request{ID: 7, Op: verbs.OpSend, Local: mr.Range(128, 4)}); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil || r.nc != 1 || r.nm != 0 || out[0].ID != 7 || out[0].Err() != nil {
				t.Fatalf("completion: %+v %+v", r, out[0])
			}
			var got [1]krcore.Message
			if _, err := echo.PopMsgsWait(ctx, got[:]); err != nil {
				t.Fatal(err)
			}
			echo.PushRecv(*got[0].Buf)
			wait()
			sendFrom(t, ctx, peer, echo, "pong")
			r = <-done
			if r.err != nil || r.nc != 0 || r.nm != 1 || string(msgBytes(msgs[0])) != "pong" {
				t.Fatalf("message: %+v %+v", r, msgs[0])
			}
			q.PushRecv(*msgs[0].Buf)

			// Both at once.
			if _, err := q.Push(ctx, true, krcore.Request{ID: 8, Op: verbs.OpSend, Local: mr.Range(128, 4)}); err != nil {
				t.Fatal(err)
			}
			if _, err := echo.PopMsgsWait(ctx, got[:]); err != nil {
				t.Fatal(err)
			}
			echo.PushRecv(*got[0].Buf)
			sendFrom(t, ctx, peer, echo, "both")
			var tc, tm int
			for tc == 0 || tm == 0 {
				nc, nm, err := q.PopAnyWait(ctx, out[:], msgs[:])
				if err != nil {
					t.Fatal(err)
				}
				tc, tm = tc+nc, tm+nm
			}
			if tc != 1 || tm != 1 || out[0].ID != 8 || string(msgBytes(msgs[0])) != "both" {
				t.Fatalf("both: %d %d %+v %+v", tc, tm, out[0], msgs[0])
			}

			// Close wakes a sleeping waiter with ErrClosed.
			wait()
			q.Close()
			select {
			case r := <-done:
				if !errors.Is(r.err, krcore.ErrClosed) {
					t.Fatalf("after Close: %+v, want ErrClosed", r)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Close did not wake PopAnyWait")
			}
		})
	}
}

// popAnyPair makes a queue of api bound to port 21 and an echo queue of
// peer bound to 22, each connected to the other's port, the echo with two
// receive buffers posted.
func popAnyPair(t *testing.T, ctx context.Context, api, peer krcore.API) (q, echo krcore.VQ) {
	t.Helper()
	var err error
	if q, err = api.Queue(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	if echo, err = peer.Queue(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { echo.Close() })
	if err := q.Bind(21); err != nil {
		t.Fatal(err)
	}
	if err := echo.Bind(22); err != nil {
		t.Fatal(err)
	}
	if err := q.Connect(ctx, peer.Node(), &krcore.ConnectOptions{Port: 22}); err != nil {
		t.Fatal(err)
	}
	if err := echo.Connect(ctx, api.Node(), &krcore.ConnectOptions{Port: 21}); err != nil {
		t.Fatal(err)
	}
	buf, err := peer.RegMR(256, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Deregister(buf) })
	if err := echo.PushRecv(buf.Range(0, 64), buf.Range(64, 64)); err != nil {
		t.Fatal(err)
	}
	return q, echo
}

// sendFrom SENDs s on echo, a queue of api, and waits for its completion.
func sendFrom(t *testing.T, ctx context.Context, api krcore.API, echo krcore.VQ, s string) {
	t.Helper()
	src, err := api.RegMR(64, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer api.Deregister(src)
	copy(src.Bytes(), s)
	if _, err := echo.Push(ctx, true, krcore.Request{ID: 1, Op: verbs.OpSend, Local: src.Range(0, len(s))}); err != nil {
		t.Fatal(err)
	}
	var out [1]krcore.Completion
	if _, err := echo.PopWait(ctx, out[:]); err != nil || out[0].Err() != nil {
		t.Fatalf("send %q: %v %v", s, err, out[0].Err())
	}
}

// msgBytes is a message's payload, in its posted buffer or its own.
func msgBytes(m krcore.Message) []byte {
	if m.Buf != nil {
		return m.Buf.MR.Bytes()[m.Buf.Off : m.Buf.Off+m.Len]
	}
	return m.Data
}
