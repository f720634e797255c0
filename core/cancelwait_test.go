package core_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/bounded"
	"github.com/krcore/krcore/verbs"
)

// TestHostileCancellingWaiters: many goroutines wait on one VQ, for its
// port's messages and for its completions, each within a context that
// ends after a random short time and then waiting again, while a peer
// sends numbered messages to the port and the VQ's own READs complete:
// every message reaches exactly one waiter and every completion is popped
// exactly once, none lost to a context that ended as it came; then Close
// fails every waiter with ErrClosed within a bound.
func TestHostileCancellingWaiters(t *testing.T) {
	onDCPairs(t, func(t *testing.T, a, b *core.Runtime) {
		q, req := reader(t, b, a, "r")
		if err := q.Bind(9); err != nil {
			t.Fatal(err)
		}
		snd := mustQueue(t, a, b.Node(), &krcore.ConnectOptions{Port: 9})
		buf, err := a.RegMR(64, verbs.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		long, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		const msgs, reads, each = 400, 600, 6
		var mu sync.Mutex
		gotMsg, gotWC := make(map[uint32]int), make(map[uint64]int)
		res := make(map[string]chan error)
		wait := func(msgWaiter bool, seed uint64) error {
			rng := rand.New(rand.NewPCG(seed, 1))
			var ms [4]krcore.Message
			var cs [4]krcore.Completion
			for {
				wctx, wcancel := context.WithTimeout(long, time.Duration(rng.IntN(300))*time.Microsecond)
				var n int
				var err error
				if msgWaiter {
					n, err = q.PopMsgsWait(wctx, ms[:])
				} else {
					n, err = q.PopWait(wctx, cs[:])
				}
				wcancel()
				mu.Lock()
				for i := range n {
					if msgWaiter {
						gotMsg[ms[i].Imm]++
					} else {
						gotWC[cs[i].ID]++
						if cs[i].Status != verbs.Success {
							err = fmt.Errorf("READ %d: %v", cs[i].ID, cs[i].Status)
						}
					}
				}
				mu.Unlock()
				switch {
				case err == nil:
				case errors.Is(err, context.DeadlineExceeded) && long.Err() == nil:
				default:
					return err
				}
			}
		}
		for i := range 2 * each {
			ch := make(chan error, 1)
			res[fmt.Sprintf("waiter#%d", i)] = ch
			go func() { ch <- wait(i%2 == 0, uint64(i)) }()
		}
		go func() { // the peer's messages, numbered by their immediates
			var cs [8]krcore.Completion
			for i := range msgs {
				r := krcore.Request{ID: uint64(i), Op: verbs.OpSendImm, Imm: uint32(i), Local: buf.Range(0, 8)}
				if _, err := snd.Push(long, true, r); err != nil {
					return
				}
				if _, err := snd.PopWait(long, cs[:1]); err != nil {
					return
				}
			}
		}()
		for i := range reads {
			r := req
			r.ID = uint64(i)
			if _, err := q.Push(long, true, r); err != nil {
				t.Fatal(err)
			}
		}
		for {
			mu.Lock()
			m, w := len(gotMsg), len(gotWC)
			mu.Unlock()
			if m == msgs && w == reads {
				break
			}
			if long.Err() != nil {
				t.Fatalf("%d of %d messages and %d of %d completions came to the waiters", m, msgs, w, reads)
			}
			time.Sleep(time.Millisecond)
		}
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
		bounded.AllFail(t, 5*time.Second, res, krcore.ErrClosed)
		for imm, k := range gotMsg {
			if k != 1 || imm >= msgs {
				t.Errorf("message %d came %d times", imm, k)
			}
		}
		for id, k := range gotWC {
			if k != 1 || id >= reads {
				t.Errorf("completion %d popped %d times", id, k)
			}
		}
	})
}
