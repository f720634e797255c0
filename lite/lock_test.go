package lite_test

import (
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore/lite"
)

// waitTickets waits until n tickets of l (made by NewLock) were taken.
func waitTickets(t *testing.T, l *lite.Lock, n uint32) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); lite.Tickets(l) < n; runtime.Gosched() {
		if time.Now().After(end) {
			t.Fatalf("%d tickets taken after 5 s, want %d", lite.Tickets(l), n)
		}
	}
}

// openLock opens the lock name mastered by node 2 in n.
func openLock(t *testing.T, n *lite.Node, name string) *lite.Lock {
	t.Helper()
	l, err := n.OpenLock(ctxT(t), 2, name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestLockFIFO: waiters on both nodes acquire in the order they asked.
func TestLockFIFO(t *testing.T) {
	masterAPI, mappers := apis(t)
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			master, mapper := open(t, masterAPI), open(t, api)
			first, err := master.NewLock(ctx, "fifo")
			if err != nil {
				t.Fatal(err)
			}
			if err := first.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			const waiters = 6
			var mu sync.Mutex
			var order []int
			var wg sync.WaitGroup
			for i := range waiters {
				l := openLock(t, []*lite.Node{master, mapper}[i%2], "fifo")
				wg.Go(func() {
					if err := l.Lock(ctx); err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					order = append(order, i)
					mu.Unlock()
					if err := l.Unlock(ctx); err != nil {
						t.Error(err)
					}
				})
				waitTickets(t, first, uint32(i+2)) // i+1 waiters and the holder
			}
			if err := first.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			if want := []int{0, 1, 2, 3, 4, 5}; !slices.Equal(order, want) {
				t.Fatalf("acquired in order %v, want %v", order, want)
			}
		})
	}
}

// TestLockExclusion: goroutines on two nodes increment a counter in an
// LMR under the lock, reading it, yielding, then writing it back: a lost
// update shows in the count. The counter is remote memory, as the state a
// LITE lock guards is: the race detector sees no ordering through a soft
// RNIC's registered (off-heap) memory, so it could not judge a Go variable
// handed over that way; under -race it checks the lock's own state.
func TestLockExclusion(t *testing.T) {
	masterAPI, mappers := apis(t)
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			master, mapper := open(t, masterAPI), open(t, api)
			if _, err := master.NewLock(ctx, "counter"); err != nil {
				t.Fatal(err)
			}
			mem, err := master.Malloc(ctx, "counter", 8, lite.Read|lite.Write)
			if err != nil {
				t.Fatal(err)
			}
			const each, per = 20, 3
			var wg sync.WaitGroup
			for i := range 2 * per {
				n := []*lite.Node{master, mapper}[i%2]
				l := openLock(t, n, "counter")
				h, err := n.Map(ctx, 2, "counter", lite.Read|lite.Write)
				if err != nil {
					t.Fatal(err)
				}
				wg.Go(func() {
					var b [8]byte
					for range each {
						err := l.Lock(ctx)
						if err == nil {
							err = n.Read(ctx, h, 0, b[:])
						}
						runtime.Gosched() // another holder would step in here
						binary.LittleEndian.PutUint64(b[:], binary.LittleEndian.Uint64(b[:])+1)
						if err == nil {
							err = n.Write(ctx, h, 0, b[:])
						}
						if err == nil {
							err = l.Unlock(ctx)
						}
						if err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			if got := binary.LittleEndian.Uint64(mem.Bytes()); got != 2*per*each {
				t.Fatalf("counter %d after %d increments under the lock", got, 2*per*each)
			}
		})
	}
}

// TestLockLease: a holder keeps the lock past its lease while it lives;
// a holder whose Node closes without Unlock loses it after a lease, and
// the next holder is told (ErrLockBroken) and holds the lock.
func TestLockLease(t *testing.T) {
	const lease = 300 * time.Millisecond
	masterAPI, mappers := apis(t)
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			master, mapper := open(t, masterAPI), open(t, api) // the test closes mapper
			waiter, err := master.NewLock(ctx, "lease", lite.Lease(lease))
			if err != nil {
				t.Fatal(err)
			}
			holder := openLock(t, mapper, "lease")

			if err := holder.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			released := false
			errc := make(chan error, 1)
			go func() {
				err := waiter.Lock(ctx)
				mu.Lock()
				defer mu.Unlock()
				if err == nil && !released {
					err = errors.New("acquired while the holder held it")
				}
				errc <- err
			}()
			waitTickets(t, waiter, 2)
			time.Sleep(3 * lease) // the holder holds three leases
			mu.Lock()
			released = true
			mu.Unlock()
			if err := holder.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatalf("Lock after a live holder held 3 leases: %v", err)
			}
			if err := waiter.Unlock(ctx); err != nil {
				t.Fatal(err)
			}

			if err := holder.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := mapper.Close(); err != nil { // the holder dies holding
				t.Fatal(err)
			}
			start := time.Now()
			if err := waiter.Lock(ctx); !errors.Is(err, lite.ErrLockBroken) {
				t.Fatalf("Lock after the holder's Node closed: %v, want ErrLockBroken", err)
			}
			if d := time.Since(start); d < lease || d > 5*lease {
				t.Fatalf("broke the lock after %v, lease %v", d, lease)
			}
			if err := waiter.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := waiter.Lock(ctx); err != nil {
				t.Fatalf("Lock after a clean Unlock: %v", err)
			}
			waiter.Unlock(ctx)
		})
	}
}

// TestLockCancel: a waiter that gives up does not hold up the line: the
// lock passes over its ticket at once while its Node lives, and after a
// lease if the Node closed; neither is a broken lock.
func TestLockCancel(t *testing.T) {
	// Long enough that passing over a ticket (within lease/2) is told
	// from waiting out a lease under -race on a loaded machine: at 500 ms
	// the pass took 379 ms once at load 35.
	const lease = 2 * time.Second
	masterAPI, mappers := apis(t)
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			master, mapper := open(t, masterAPI), open(t, api) // the test closes mapper
			a, err := master.NewLock(ctx, "cancel", lite.Lease(lease))
			if err != nil {
				t.Fatal(err)
			}
			b, c := openLock(t, mapper, "cancel"), openLock(t, master, "cancel")

			// giveUp queues b behind n-1 tickets and cancels it.
			giveUp := func(n uint32) {
				bctx, cancel := context.WithCancel(ctx)
				errc := make(chan error, 1)
				go func() { errc <- b.Lock(bctx) }()
				waitTickets(t, a, n)
				cancel()
				if err := <-errc; !errors.Is(err, context.Canceled) {
					t.Fatalf("Lock cancelled while waiting: %v", err)
				}
			}
			// after locks c behind a once a unlocks, and times it.
			after := func(n uint32) (time.Duration, error) {
				errc := make(chan error, 1)
				go func() { errc <- c.Lock(ctx) }()
				waitTickets(t, a, n)
				start := time.Now()
				if err := a.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
				err := <-errc
				return time.Since(start), err
			}

			if err := a.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			giveUp(2)
			if d, err := after(3); err != nil || d > lease/2 {
				t.Fatalf("Lock behind a cancelled waiter: %v after %v, want nil within %v", err, d, lease/2)
			}
			if err := c.Unlock(ctx); err != nil {
				t.Fatal(err)
			}

			if err := a.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			giveUp(5)
			if err := mapper.Close(); err != nil { // no one hands its ticket on now
				t.Fatal(err)
			}
			if d, err := after(6); err != nil || d < lease {
				t.Fatalf("Lock behind a waiter whose Node closed: %v after %v, want nil after a lease (%v)", err, d, lease)
			}
			if err := c.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
