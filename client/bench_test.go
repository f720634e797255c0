package client_test

import (
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// BenchmarkRead8 is a synchronous 8 B READ to node 2 (push, wait for the
// completion), on the embedded runtime and through krcored: the ratio is
// the daemon's hop (two shared-memory rings, two processes' worth of
// goroutines; here one process plays both sides).
func BenchmarkRead8(b *testing.B) {
	e := startEnv(b)
	ctx := ctxT(b)
	for _, mode := range []string{"embedded", "daemon"} {
		b.Run(mode, func(b *testing.B) {
			q, req := read8(b, e, mode)
			var out [1]krcore.Completion
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				req.ID = uint64(i)
				if err := q.PushOne(ctx, true, req); err != nil {
					b.Fatal(err)
				}
				if _, err := q.PopWait(ctx, out[:]); err != nil || out[0].Err() != nil {
					b.Fatal(err, out[0].Err())
				}
			}
		})
	}
}

// BenchmarkRead8Window streams 8 B READs to node 2 with 16 in flight, on
// the embedded runtime and through krcored: a request's cost in the
// daemon's pump (ring to runtime, completion to ring, its latency
// histogram) shows here more than in BenchmarkRead8, where the wake-ups
// dominate.
func BenchmarkRead8Window(b *testing.B) {
	const window = 16
	e := startEnv(b)
	ctx := ctxT(b)
	for _, mode := range []string{"embedded", "daemon"} {
		b.Run(mode, func(b *testing.B) {
			q, req := read8(b, e, mode)
			out := make([]krcore.Completion, window)
			inflight := 0
			pop := func() {
				n, err := q.PopWait(ctx, out)
				if err != nil {
					b.Fatal(err)
				}
				for _, c := range out[:n] {
					if c.Err() != nil {
						b.Fatal(c.Err())
					}
				}
				inflight -= n
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				req.ID = uint64(i)
				if _, err := q.Push(ctx, true, req); err != nil {
					b.Fatal(err)
				}
				if inflight++; inflight == window {
					pop()
				}
			}
			for inflight > 0 {
				pop()
			}
		})
	}
}

// read8 is a VQ of mode's API connected to node 2 and an 8 B READ of its
// table.
func read8(b testing.TB, e *env, mode string) (krcore.VQ, krcore.Request) {
	api := modeAPI(b, e, mode)
	q, g := connect(b, ctxT(b), api)
	buf, err := api.RegMR(64, verbs.AccessAll)
	if err != nil {
		b.Fatal(err)
	}
	return q, krcore.Request{Op: verbs.OpRead, Local: buf.Range(0, 8), Remote: g.At(0)}
}

// BenchmarkConnectWarm is a warm Connect: a cached lookup embedded, a
// round trip on the VQ's rings through the daemon.
func BenchmarkConnectWarm(b *testing.B) {
	e := startEnv(b)
	ctx := ctxT(b)
	for _, mode := range []string{"embedded", "daemon"} {
		b.Run(mode, func(b *testing.B) {
			api := modeAPI(b, e, mode)
			q, _ := connect(b, ctx, api)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := q.Connect(ctx, 2, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// modeAPI is node 1's runtime embedded, or through the env's daemon.
func modeAPI(b testing.TB, e *env, mode string) krcore.API {
	if mode == "daemon" {
		return attach(b, e)
	}
	return core.Embed(e.c.Node(1))
}

// BenchmarkNewcomer is a new client's way to its first READ through
// krcored, what examples/race's newcomers do per memory node: attach, a
// queue connected to node 2, the region, a registered buffer, one 8 B
// READ, then detach; "calls" makes the queue, connects it and learns the
// region in three calls one after another, "queueto" in one (QueueTo).
// Daemon and client share this process, so it counts their work
// (syscalls, allocation, handoffs between goroutines) and not a second
// process's wake-ups; the step metrics are per-op means.
func BenchmarkNewcomer(b *testing.B) {
	e := startEnv(b)
	ctx := ctxT(b)
	b.Run("calls", func(b *testing.B) {
		newcomers(b, e.sock, []string{"attach", "queue", "connect", "region"}, func(c *client.Client, lap func()) (krcore.VQ, krcore.Region) {
			q, err := c.Queue()
			if err != nil {
				b.Fatal(err)
			}
			lap()
			if err := q.Connect(ctx, 2, nil); err != nil {
				b.Fatal(err)
			}
			lap()
			g, err := c.Region(ctx, 2, "table")
			if err != nil {
				b.Fatal(err)
			}
			return q, g
		})
	})
	b.Run("queueto", func(b *testing.B) {
		newcomers(b, e.sock, []string{"attach", "queueto"}, func(c *client.Client, _ func()) (krcore.VQ, krcore.Region) {
			q, g, err := c.QueueTo(ctx, 2, nil, "table")
			if err != nil {
				b.Fatal(err)
			}
			return q, g
		})
	})
}

// newcomers runs BenchmarkNewcomer's loop; dial makes the connected queue
// and the region, calling lap between steps (steps names them, from
// attach on, and regmr and read follow).
func newcomers(b *testing.B, sock string, steps []string, dial func(c *client.Client, lap func()) (krcore.VQ, krcore.Region)) {
	ctx := ctxT(b)
	steps = append(steps, "regmr", "read")
	sum := make([]time.Duration, len(steps))
	var t []time.Time
	lap := func() { t = append(t, time.Now()) }
	for b.Loop() {
		t = append(t[:0], time.Now())
		c, err := client.Attach(ctx, client.Options{Socket: sock})
		if err != nil {
			b.Fatal(err)
		}
		lap()
		q, g := dial(c, lap)
		lap()
		m, err := c.RegMR(1<<16, verbs.AccessLocalWrite)
		if err != nil {
			b.Fatal(err)
		}
		lap()
		var out [1]krcore.Completion
		if err := q.PushOne(ctx, true, krcore.Request{Op: verbs.OpRead, Local: m.Range(0, 8), Remote: g.At(0)}); err != nil {
			b.Fatal(err)
		}
		if _, err := q.PopWait(ctx, out[:]); err != nil || out[0].Err() != nil {
			b.Fatal(err, out[0].Err())
		}
		lap()
		for i := range steps {
			sum[i] += t[i+1].Sub(t[i])
		}
		c.Close()
	}
	for i, s := range steps {
		b.ReportMetric(float64(sum[i].Microseconds())/float64(b.N), s+"-us")
	}
}
