package lite_test

import (
	"context"
	"testing"

	"log/slog"
	"path/filepath"
	"slices"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/daemon"
	"github.com/krcore/krcore/lite"
	"github.com/krcore/krcore/verbs"
)

// BenchmarkReadVsVQ runs an 8 B lite Read and, on the same API, a VQ READ
// (Push, then PopWait, as lite waits) of the same node, as krbench lite
// does (krcored in this process, its pump spinning 200 us): issue 15
// wants the first within 1.1x of the second, embedded and through
// krcored. p50-ns is krbench's t_typical. Through krcored both series
// have two modes, ~4 us (the pump caught spinning) and ~30 us (asleep),
// and a run stays in one for a while whichever series it measures: compare
// them over several -count, not one pair.
func BenchmarkReadVsVQ(b *testing.B) {
	ctx := context.Background()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 3})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	sock := filepath.Join(b.TempDir(), "krcored.sock")
	srv, err := daemon.New(c.Node(3), daemon.Config{Socket: sock, Spin: 200 * time.Microsecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background()) }()
	defer func() { srv.Close(); <-done }()
	cl, err := client.Attach(ctx, client.Options{Socket: sock})
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	mappers := map[string]krcore.API{"embedded": core.Embed(c.Node(1)), "daemon": cl}
	masterAPI := core.Embed(c.Node(2))
	master := open(b, masterAPI)
	if _, err := master.Malloc(ctx, "lmr", 1<<16, lite.Read); err != nil {
		b.Fatal(err)
	}
	raw, err2 := masterAPI.RegMR(1<<16, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err2 != nil {
		b.Fatal(err2)
	}
	if err := masterAPI.Export("raw", raw, 0, 1<<16, verbs.AccessRemoteRead); err != nil {
		b.Fatal(err)
	}
	for _, api := range []string{"embedded", "daemon"} {
		a := mappers[api]
		n, err := lite.Open(ctx, a, lite.Options{})
		if err != nil {
			b.Fatal(err)
		}
		h, err := n.Map(ctx, 2, "lmr", lite.Read)
		if err != nil {
			b.Fatal(err)
		}
		q, err := a.Queue()
		if err != nil {
			b.Fatal(err)
		}
		if err := q.Connect(ctx, 2, nil); err != nil {
			b.Fatal(err)
		}
		g, err := q.Region(ctx, "raw")
		if err != nil {
			b.Fatal(err)
		}
		local, err := a.RegMR(64, verbs.AccessLocalWrite)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(api+"/lite", func(b *testing.B) {
			buf := make([]byte, 8)
			var d []time.Duration
			for b.Loop() {
				t0 := time.Now()
				if err := n.Read(ctx, h, 64, buf); err != nil {
					b.Fatal(err)
				}
				d = append(d, time.Since(t0))
			}
			reportMedian(b, d, "p50-ns")
		})
		b.Run(api+"/vq", func(b *testing.B) {
			req := krcore.Request{Op: verbs.OpRead, Local: local.Range(0, 8), Remote: g.At(64)}
			var out [1]krcore.Completion
			var d []time.Duration
			for b.Loop() {
				t0 := time.Now()
				if _, err := q.Push(ctx, true, req); err != nil {
					b.Fatal(err)
				}
				if _, err := q.PopWait(ctx, out[:]); err != nil {
					b.Fatal(err)
				}
				if err := out[0].Err(); err != nil {
					b.Fatal(err)
				}
				d = append(d, time.Since(t0))
			}
			reportMedian(b, d, "p50-ns")
		})
		q.Close()
		a.Deregister(local)
		n.Close()
	}
}

// reportMedian reports the median of d (krbench's t_typical), in ns, as
// the metric unit.
func reportMedian(b *testing.B, d []time.Duration, unit string) {
	slices.Sort(d)
	if len(d) > 0 {
		b.ReportMetric(float64(d[len(d)/2].Nanoseconds()), unit)
	}
}
