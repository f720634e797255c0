package lite_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/bounded"
	"github.com/krcore/krcore/lite"
)

// hammer calls id at node 2 from goroutines of caller, each in a loop
// until a call fails, checking its replies; it returns once each had a
// reply. stop returns each goroutine's error.
func hammer(t *testing.T, ctx context.Context, caller *lite.Node, id uint32, goroutines int) (stop func(what string) []error) {
	var wg, started sync.WaitGroup
	errs := make([]error, goroutines)
	started.Add(goroutines)
	for g := range goroutines {
		wg.Go(func() {
			resp := make([]byte, 128)
			for i := 0; ; i++ {
				req := fmt.Appendf(nil, "goroutine %d call %d", g, i)
				k, err := caller.Call(ctx, 2, id, req, resp)
				if i == 0 {
					started.Done()
				}
				if err != nil {
					errs[g] = err
					return
				}
				if !bytes.Equal(resp[:k], reversed(req)) {
					errs[g] = fmt.Errorf("reply %q to %q", resp[:k], req)
					return
				}
			}
		})
	}
	started.Wait()
	return func(what string) []error {
		bounded.Within(t, 10*time.Second, what+": the callers", func() error { wg.Wait(); return nil })
		return errs
	}
}

// TestRPCCloseMidTraffic: a service or the caller's Node that closes
// while goroutines call in a loop ends every call at once with the error
// of what closed (ErrNoService, ErrClosed), never a wrong reply or the
// calls' deadline; a second Close of either is harmless. (A callee's Node
// that closes answers the calls it holds, TestRPCNodeClose; a call made
// after it closed waits for its deadline, as for a callee that died.)
func TestRPCCloseMidTraffic(t *testing.T) {
	serverAPI, callers := apis(t)
	for name, api := range callers {
		t.Run(name, func(t *testing.T) {
			settle := func(what string, stop func(string) []error, want error) {
				t.Helper()
				for _, err := range stop(what) {
					if !errors.Is(err, want) {
						t.Errorf("%s: a call ended with %v, want %v", what, err, want)
					}
				}
			}
			server, caller := open(t, serverAPI), open(t, api)
			svc := echo(t, server, 1)
			stop := hammer(t, ctxT(t), caller, 1, 8)
			svc.Close()
			settle("service closed", stop, lite.ErrNoService)
			if err := svc.Close(); err != nil {
				t.Errorf("second Close of a service: %v", err)
			}

			echo(t, server, 2)
			stop = hammer(t, ctxT(t), caller, 2, 8)
			caller.Close()
			settle("caller's Node closed", stop, krcore.ErrClosed)
			if err := caller.Close(); err != nil {
				t.Errorf("second Close of a Node: %v", err)
			}
		})
	}
}

// TestRPCCancelRacesReply: callers that give up on their calls about when
// the replies come (a slot then kept until its late reply, and its
// bookkeeping reused by the slot's next call) never take another call's
// reply, and once the callers stop every slot serves again: a round of
// calls as many as the ring's slots, at once, all answered.
func TestRPCCancelRacesReply(t *testing.T) {
	serverAPI, callers := apis(t)
	for name, api := range callers {
		t.Run(name, func(t *testing.T) {
			server, caller := open(t, serverAPI), open(t, api)
			echo(t, server, 5)
			if _, err := caller.Call(ctxT(t), 2, 5, nil, nil); err != nil { // the session set up
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					resp := make([]byte, 128)
					for i := range 60 {
						req := fmt.Appendf(nil, "goroutine %d call %d", g, i)
						ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%8)*100*time.Microsecond)
						k, err := caller.Call(ctx, 2, 5, req, resp)
						cancel()
						if err == nil && !bytes.Equal(resp[:k], reversed(req)) {
							t.Errorf("reply %q to %q", resp[:k], req)
							return
						}
						if err != nil && !errors.Is(err, context.DeadlineExceeded) {
							t.Errorf("call %q: %v", req, err)
							return
						}
					}
				})
			}
			bounded.Within(t, 30*time.Second, "the cancelling callers", func() error { wg.Wait(); return nil })
			const slots = 32
			errs := make(chan error, slots)
			for g := range slots {
				wg.Go(func() {
					req := fmt.Appendf(nil, "last round %d", g)
					resp := make([]byte, 64)
					k, err := caller.Call(ctxT(t), 2, 5, req, resp)
					if err == nil && !bytes.Equal(resp[:k], reversed(req)) {
						err = fmt.Errorf("reply %q to %q", resp[:k], req)
					}
					errs <- err
				})
			}
			bounded.Within(t, 15*time.Second, "the last round", func() error { wg.Wait(); return nil })
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// TestRPCCalleeRestarts: a callee Node that closes and opens again on the
// same port, again and again, between rounds of calls from goroutines at
// once: each round's calls all get their own replies (the caller's
// session, its spare queue among it, set up again), none a wrong one.
func TestRPCCalleeRestarts(t *testing.T) {
	serverAPI, callers := apis(t)
	for name, api := range callers {
		t.Run(name, func(t *testing.T) {
			caller := open(t, api)
			for round := range 4 {
				server := open(t, serverAPI)
				echo(t, server, 6)
				var wg sync.WaitGroup
				for g := range 4 {
					wg.Go(func() {
						resp := make([]byte, 64)
						for i := range 5 {
							req := fmt.Appendf(nil, "round %d goroutine %d call %d", round, g, i)
							k, err := caller.Call(ctxT(t), 2, 6, req, resp)
							if err != nil || !bytes.Equal(resp[:k], reversed(req)) {
								t.Errorf("%q: reply %q, %v", req, resp[:k], err)
								return
							}
						}
					})
				}
				bounded.Within(t, 15*time.Second, "a round of calls", func() error { wg.Wait(); return nil })
				if err := server.Close(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
