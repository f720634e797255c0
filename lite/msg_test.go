package lite_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/lite"
)

// TestMessages: messages from many goroutines reach a named endpoint, each
// whole and from its sender's node; a name with no endpoint is
// ErrNoEndpoint; a closed endpoint's Recv is ErrClosed.
func TestMessages(t *testing.T) {
	receiverAPI, senders := apis(t)
	for name, api := range senders {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			receiver, sender := open(t, receiverAPI), open(t, api)
			ep, err := receiver.Endpoint("inbox")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := receiver.Endpoint("inbox"); !errors.Is(err, krcore.ErrBusy) {
				t.Fatalf("a second endpoint of the same name: %v, want ErrBusy", err)
			}
			const goroutines, msgs = 8, 50 // more than the endpoint queues unacknowledged
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					for i := range msgs {
						if err := sender.Send(ctx, 2, "inbox", fmt.Appendf(nil, "%d/%d", g, i)); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			seen := map[string]bool{}
			for range goroutines * msgs {
				m, err := ep.Recv(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if m.From != 1 || seen[string(m.Data)] {
					t.Fatalf("message %q from node %d (seen before: %v)", m.Data, m.From, seen[string(m.Data)])
				}
				seen[string(m.Data)] = true
			}
			wg.Wait()
			if err := sender.Send(ctx, 2, "nobody", []byte("x")); !errors.Is(err, lite.ErrNoEndpoint) {
				t.Fatalf("send to no endpoint: %v, want ErrNoEndpoint", err)
			}
			ep.Close()
			if _, err := ep.Recv(ctx); !errors.Is(err, krcore.ErrClosed) {
				t.Fatalf("Recv on a closed endpoint: %v, want ErrClosed", err)
			}
			if err := sender.Send(ctx, 2, "inbox", []byte("late")); !errors.Is(err, lite.ErrNoEndpoint) {
				t.Fatalf("send to a closed endpoint: %v, want ErrNoEndpoint", err)
			}
		})
	}
}

// TestMessagesBackpressure: an endpoint nobody reads stops acknowledging
// past its queue, so a sender runs out of credit and waits instead of the
// endpoint growing without bound; once the receiver reads, it goes on.
func TestMessagesBackpressure(t *testing.T) {
	receiverAPI, senders := apis(t)
	api := senders["embedded"]
	ctx := ctxT(t)
	receiver, sender := open(t, receiverAPI), open(t, api)
	ep, err := receiver.Endpoint("slow")
	if err != nil {
		t.Fatal(err)
	}
	const queued, slots = 256, 32
	sctx, stop := context.WithCancel(ctx)
	sent := make(chan int, queued+2*slots)
	var wg sync.WaitGroup
	for g := range slots + 1 {
		wg.Go(func() {
			for i := 0; ; i++ {
				if err := sender.Send(sctx, 2, "slow", []byte{byte(g)}); err != nil {
					return
				}
				sent <- g
			}
		})
	}
	// queued messages are acknowledged, then 32 more fill every slot and
	// wait for Recv: no more Sends return.
	for range queued {
		<-sent
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	select {
	case <-sent:
		t.Fatal("a Send returned with the endpoint full and every slot waiting")
	case <-short.Done():
	}
	if _, err := ep.Recv(ctx); err != nil {
		t.Fatal(err)
	}
	select { // the message Recv took is acknowledged: its sender goes on
	case <-sent:
	case <-ctx.Done():
		t.Fatal("no Send returned after Recv took a message")
	}
	stop()
	wg.Wait()
}
