package krcore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/bounded"
	"github.com/krcore/krcore/internal/testcluster"
	"github.com/krcore/krcore/verbs"
)

// TestClosedVQCalls: on a VQ closed with a request in flight (a SEND to
// a port nobody holds) and a port bound, embedded and through krcored,
// Pop, PopMsgs and Unbind return without blocking and Pop soon leaves
// nothing outstanding; then every other call fails with ErrClosed at
// once: the waits, the pushes, Bind, Connect, Region and a second Close.
func TestClosedVQCalls(t *testing.T) {
	_, apis := testcluster.APIs(t, 2)
	for name, api := range apis {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			q, err := api.Queue()
			if err != nil {
				t.Fatal(err)
			}
			if err := q.Connect(ctx, 2, &krcore.ConnectOptions{Port: 77}); err != nil {
				t.Fatal(err)
			}
			if err := q.Bind(55); err != nil {
				t.Fatal(err)
			}
			mr, err := api.RegMR(256, verbs.AccessAll)
			if err != nil {
				t.Fatal(err)
			}
			defer api.Deregister(mr)
			if err := q.PushOne(ctx, false, krcore.Request{ID: 1, Op: verbs.OpSend, Local: mr.Range(0, 8)}); err != nil {
				t.Fatal(err)
			}
			if err := q.Close(); err != nil {
				t.Fatal(err)
			}
			bounded.Within(t, 5*time.Second, "Pop, PopMsgs and Unbind", func() error {
				q.Pop(nil)
				q.PopMsgs(make([]krcore.Message, 2))
				q.Unbind()
				return nil
			})
			// Embedded, the SEND may still be in flight: a closed queue's
			// requests complete as they finish. Through krcored Close
			// flushed it.
			bounded.Within(t, 5*time.Second, "Pop until nothing is outstanding", func() error {
				for q.Outstanding() > 0 {
					q.Pop(make([]krcore.Completion, 1))
					time.Sleep(time.Millisecond)
				}
				return nil
			})
			calls := map[string]func() error{
				"PopWait":     func() error { _, err := q.PopWait(ctx, make([]krcore.Completion, 4)); return err },
				"PopMsgsWait": func() error { _, err := q.PopMsgsWait(ctx, make([]krcore.Message, 2)); return err },
				"PopAnyWait": func() error {
					_, _, err := q.PopAnyWait(ctx, make([]krcore.Completion, 2), make([]krcore.Message, 2))
					return err
				},
				"Push":     func() error { _, err := q.Push(ctx, true, krcore.Request{Op: verbs.OpRead}); return err },
				"PushOne":  func() error { return q.PushOne(ctx, true, krcore.Request{Op: verbs.OpRead}) },
				"PushRecv": func() error { return q.PushRecv(mr.Range(0, 64)) },
				"Bind":     func() error { return q.Bind(56) },
				"Connect":  func() error { return q.Connect(ctx, 2, nil) },
				"Region":   func() error { _, err := q.Region(ctx, "x"); return err },
				"Close":    q.Close,
			}
			for call, f := range calls {
				if err := bounded.Within(t, 5*time.Second, call, f); !errors.Is(err, krcore.ErrClosed) {
					t.Errorf("%s on a closed VQ: %v, want ErrClosed", call, err)
				}
			}
		})
	}
}
