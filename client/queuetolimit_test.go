package client_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/verbs"
)

// TestQueueToLimit: QueueTo calls that krcored answers side by side (each
// waits for a connect) never leave a client more queues than its limit
// (daemon.Config.MaxVQs); the ones over it fail with ErrLimit.
func TestQueueToLimit(t *testing.T) {
	e := startEnv(t)
	e.stop()
	const limit = 2
	e.startWith(t, daemon.Config{MaxVQs: limit})
	ctx := ctxT(t)
	for round := range 20 {
		c := attach(t, e)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var made []krcore.VQ
		for range 5 {
			wg.Go(func() {
				q, _, err := c.QueueTo(ctx, 2, nil, "table")
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					made = append(made, q)
				case !errors.Is(err, verbs.ErrLimit):
					t.Errorf("QueueTo over the limit: %v, want ErrLimit", err)
				}
			})
		}
		wg.Wait()
		if n := daemonVQs(e, c); len(made) > limit || n > limit {
			t.Fatalf("round %d: %d QueueTo calls succeeded, the daemon holds %d queues of the client: limit %d", round, len(made), n, limit)
		}
		c.Close()
	}
}
