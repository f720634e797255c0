package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/bench/report"
	"github.com/krcore/krcore/internal/perf"
	"github.com/krcore/krcore/verbs"
)

// Full-mesh creation: every node of an in-process cluster gets a
// connection to every other, KRCore's way (each node connects a VQ to each
// other node: one MetaServer READ each, no handshake) and raw verbs' way
// (each pair creates an RC QP on both nodes, exchanges endpoints out of
// band and takes both to RTS). Rows are wall-clock times of one whole mesh.
const (
	seriesKrcore = "krcore"
	seriesRC     = "rc"
	meshReps     = 20 // default repetitions per series
	// clusterRecvSlots is each in-process cluster node's shared receive
	// ring (the runtime's default is 1024 buffers of 4 KiB).
	clusterRecvSlots = 128
)

// meshIters is the repetitions of each series: -n, else meshReps.
func (cfg *config) meshIters() int {
	if cfg.n > 0 {
		return cfg.n
	}
	return meshReps
}

// startCluster brings up an in-process cluster of n nodes and reports how
// long that took.
func startCluster(ctx context.Context, n int, cfg *config, stderr io.Writer) (*cluster.Cluster, time.Duration, error) {
	sctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	t0 := time.Now()
	// Small receive rings: a node of these clusters receives control
	// messages and one ping-pong at most, and -nodes may be 64.
	cl, err := cluster.Start(sctx, cluster.Config{Nodes: n, Runtime: core.Config{Logger: slogTo(stderr), RecvSlots: clusterRecvSlots}})
	if err != nil {
		return nil, 0, fmt.Errorf("start a %d-node cluster: %w", n, err)
	}
	return cl, time.Since(t0), nil
}

// runMesh measures full-mesh creation over -nodes nodes, in alternating
// blocks of one mesh each.
func runMesh(ctx context.Context, cfg *config, out *report.Output, stderr io.Writer, logf func(string, ...any)) (err error) {
	n := cfg.nodes
	cl, up, err := startCluster(ctx, n, cfg, stderr)
	if err != nil {
		return err
	}
	defer cl.Close()
	devs := make([]verbs.Device, len(cl.Devices))
	for i, d := range cl.Devices {
		devs[i] = d
	}
	rcm, err := newRCMesh(devs, cfg.timeout)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := rcm.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	km := &krMesh{rts: cl.Runtimes}
	defer km.reset()

	reps := cfg.meshIters()
	var kr, rc []time.Duration
	krOnce := func(keep bool) error {
		mctx, cancel := context.WithTimeout(ctx, cfg.timeout)
		defer cancel()
		d, err := km.create(mctx)
		if err == nil {
			err = km.reset()
		}
		if keep {
			kr = append(kr, d)
		}
		return err
	}
	rcOnce := func(keep bool) error {
		mctx, cancel := context.WithTimeout(ctx, cfg.timeout)
		defer cancel()
		d, err := rcm.create(mctx)
		if rerr := rcm.reset(); err == nil {
			err = rerr
		}
		if keep {
			rc = append(rc, d)
		}
		return err
	}
	// Warm-up: the first lookups learn the MetaServer's geometry, the
	// first QPs fault in the code.
	if err := krOnce(false); err != nil {
		return err
	}
	if err := rcOnce(false); err != nil {
		return err
	}
	logf("mesh: %d nodes, %d meshes of each kind", n, reps)
	blocks := 0
	for blocks < reps {
		first, second := krOnce, rcOnce
		if blocks%2 == 1 {
			first, second = rcOnce, krOnce
		}
		if err := first(true); err != nil {
			return fmt.Errorf("mesh: %w", err)
		}
		if err := second(true); err != nil {
			return fmt.Errorf("mesh: %w", err)
		}
		blocks++
	}
	if err := km.checkCold(reps + 1); err != nil {
		return err
	}
	a, b := perf.Latency(0, kr), perf.Latency(0, rc)
	a.Label, b.Label = seriesKrcore, seriesRC
	links := n * (n - 1)
	return out.Add(perf.Result{Title: fmt.Sprintf("Full-Mesh Creation Test, %d nodes (interleaved)", n), Test: testMesh, Mode: perf.ModeLat,
		Column: "series", Placement: placementInproc,
		Info: []perf.Field{
			{Key: "Cluster", Value: fmt.Sprintf("%d nodes (soft RNIC + KRCore runtime each) on one in-memory fabric, up in %.2f ms; node 1 embeds the MetaServer", n, float64(up)/float64(time.Millisecond))},
			{Key: "krcore", Value: fmt.Sprintf("every node, in its own goroutine, makes a VQ and connects it to every other node, cold: %d connects, each one MetaServer READ", links)},
			{Key: "rc", Value: fmt.Sprintf("every pair: an RC QP on each node (PD and CQ made beforehand), endpoints exchanged over loopback TCP (connections made beforehand), INIT/RTR/RTS on both: %d QPs; the lower node of a pair asks, pipelined", links)},
			{Key: "Rows", Value: "wall time of one whole mesh, from the start of every node's goroutine to the last connection"},
		},
		Latency: []perf.LatencyStats{a, b},
	})
}

// krMesh is the KRCore side of the mesh test.
type krMesh struct {
	rts []*core.Runtime
	qs  [][]*core.Queue
}

// create has every node connect a fresh VQ to every other node and returns
// the wall time.
func (m *krMesh) create(ctx context.Context) (time.Duration, error) {
	n := len(m.rts)
	m.qs = make([][]*core.Queue, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, rt := range m.rts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			qs := make([]*core.Queue, 0, n-1)
			defer func() { m.qs[i] = qs }()
			for _, peer := range m.rts {
				if peer == rt {
					continue
				}
				q, err := rt.Queue()
				if err != nil {
					errs[i] = err
					return
				}
				qs = append(qs, q)
				if err := q.Connect(ctx, peer.Node(), nil); err != nil {
					errs[i] = fmt.Errorf("node %d connects to node %d: %w", rt.Node(), peer.Node(), err)
					return
				}
			}
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	return time.Since(t0), errors.Join(errs...)
}

// reset closes the mesh's VQs and makes every node forget every other, so
// the next mesh is cold again.
func (m *krMesh) reset() error {
	for _, qs := range m.qs {
		for _, q := range qs {
			q.Close()
		}
	}
	m.qs = nil
	for _, rt := range m.rts {
		for _, peer := range m.rts {
			if peer != rt {
				if err := rt.Forget(context.Background(), peer.Node()); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// checkCold verifies that the connects of meshes meshes were all cold.
func (m *krMesh) checkCold(meshes int) error {
	var colds uint64
	for _, rt := range m.rts {
		colds += rt.Stats().ColdConnects
	}
	n := len(m.rts)
	if want := uint64(meshes * n * (n - 1)); colds < want {
		return fmt.Errorf("mesh: only %d of %d KRCore connects were cold", colds, want)
	}
	return nil
}

// meshQPDepth sizes the mesh's QPs: they carry no traffic.
const meshQPDepth = 16
