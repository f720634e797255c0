package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/bench/interleave"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/internal/bench/report"
	"github.com/krcore/krcore/internal/bench/vqrun"
	"github.com/krcore/krcore/internal/perf"
	"github.com/krcore/krcore/verbs"
)

// The cluster test is the runtime's walkthrough, the first thing the demo
// prints: a small in-process cluster comes up, one node connects a VQ to
// another in microseconds (cold and warm, beside a raw RC connect between
// the same two RNICs in the same run), and one-sided and two-sided work
// flows through it, checked byte for byte.
const (
	testClusterTitle = "KRCore Runtime Walkthrough"
	tourMaxIters     = 200 // per step, unless -n says otherwise
	tourEchoPort     = 80
	tourPingPort     = 81

	stepUp       = "cluster_up"
	stepCold     = "vq_connect_cold"
	stepWarm     = "vq_connect_warm"
	stepRC       = "rc_connect"
	stepRead     = "vq_read_8B"
	stepWrite    = "vq_write_8B"
	stepSendRTT  = "vq_send_64B_rtt"
	tourGreeting = "hello from node %d"
	tourScribble = "node %d was here"
)

func runCluster(ctx context.Context, cfg *config, out *report.Output, stderr io.Writer, logf func(string, ...any)) (err error) {
	n := cfg.nodes
	cl, up, err := startCluster(ctx, n, cfg, stderr)
	if err != nil {
		return err
	}
	defer cl.Close()
	srcID, dstID := krcore.NodeID(n), krcore.NodeID(n-1)
	src, dst := cl.Node(srcID), cl.Node(dstID)
	iters := min(tourMaxIters, cfg.itersOr(modeLat, 8))
	warmup := min(max(iters/10, 1), 20)
	dl := rawqp.NewDeadline(ctx, cfg.timeout)
	defer dl.Close()
	poll := newVQPoll(cfg, placementInproc)
	logf("cluster: %d nodes up in %v; node %d -> node %d, %d iterations per step", n, up, srcID, dstID, iters)

	// Node dst offers memory under a name.
	mem, err := dst.RegMR(4096, verbs.AccessAll)
	if err != nil {
		return err
	}
	defer dst.Deregister(mem)
	greeting := fmt.Sprintf(tourGreeting, dstID)
	copy(mem.Bytes(), greeting)
	if err := dst.Export("greeting", mem, 0, 4096, verbs.AccessRemoteRead|verbs.AccessRemoteWrite); err != nil {
		return err
	}

	// Connects: cold, warm, and raw RC between the same two RNICs.
	q, err := src.Queue()
	if err != nil {
		return err
	}
	defer q.Close()
	rcm, err := newRCMesh([]verbs.Device{cl.Devices[srcID-1], cl.Devices[dstID-1]}, cfg.timeout)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := rcm.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	var cold, warm, rc []time.Duration
	connect := func(forget bool, into *[]time.Duration) func(int) error {
		return func(k int) error {
			for range k {
				c := dl.Get()
				if forget {
					if err := src.Forget(c, dstID); err != nil {
						return err
					}
				}
				t0 := time.Now()
				err := q.Connect(c, dstID, nil)
				d := time.Since(t0)
				if err != nil {
					return fmt.Errorf("node %d connects to node %d: %w", srcID, dstID, err)
				}
				if into != nil {
					*into = append(*into, d)
				}
			}
			return nil
		}
	}
	rcConnect := func(into *[]time.Duration) func(int) error {
		return func(k int) error {
			for range k {
				c, cancel := context.WithTimeout(ctx, cfg.timeout)
				d, err := rcm.create(c)
				cancel()
				if rerr := rcm.reset(); err == nil {
					err = rerr
				}
				if err != nil {
					return fmt.Errorf("raw RC connect: %w", err)
				}
				if into != nil {
					*into = append(*into, d)
				}
			}
			return nil
		}
	}
	for _, f := range []func(int) error{connect(true, nil), connect(false, nil), rcConnect(nil)} {
		if err := f(warmup); err != nil {
			return err
		}
	}
	per := interleave.PerBlock(iters)
	colds0 := src.Stats().ColdConnects
	if err := interleave.Rotate(
		func() error { return connect(true, &cold)(per) },
		func() error { return connect(false, &warm)(per) },
		func() error { return rcConnect(&rc)(per) },
	); err != nil {
		return err
	}
	if got := src.Stats().ColdConnects - colds0; got != uint64(len(cold)) {
		return fmt.Errorf("cluster: %d of %d cold connects were cold", got, len(cold))
	}

	// One-sided: read the greeting, write a line node dst sees.
	rctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	region, err := src.Region(rctx, dstID, "greeting")
	if err != nil {
		return err
	}
	buf, err := src.RegMR(4096, verbs.AccessAll)
	if err != nil {
		return err
	}
	defer src.Deregister(buf)
	if _, err := vqrun.Latency(dl, q, vqrun.Poll{}, krcore.Request{Op: verbs.OpRead, Local: buf.Range(0, len(greeting)), Remote: region.At(0)}, 1, 0); err != nil {
		return err
	}
	readBack := string(buf.Bytes()[:len(greeting)])
	if readBack != greeting {
		return fmt.Errorf("cluster: READ returned %q, node %d holds %q", readBack, dstID, greeting)
	}
	scribble := fmt.Sprintf(tourScribble, srcID)
	copy(buf.Bytes()[1024:], scribble)
	if _, err := vqrun.Latency(dl, q, vqrun.Poll{}, krcore.Request{Op: verbs.OpWrite, Local: buf.Range(1024, len(scribble)), Remote: region.At(2048)}, 1, 0); err != nil {
		return err
	}
	seen := string(mem.Bytes()[2048 : 2048+len(scribble)])
	if seen != scribble {
		return fmt.Errorf("cluster: WRITE of %q left %q at node %d", scribble, seen, dstID)
	}
	reads, err := vqrun.Latency(dl, q, poll, krcore.Request{Op: verbs.OpRead, Local: buf.Range(0, 8), Remote: region.At(0)}, warmup, iters)
	if err != nil {
		return err
	}
	writes, err := vqrun.Latency(dl, q, poll, krcore.Request{Op: verbs.OpWrite, Local: buf.Range(0, 8), Remote: region.At(3072)}, warmup, iters)
	if err != nil {
		return err
	}

	// Two-sided: node src's port pings node dst's, whose VQ echoes.
	rtts, err := tourPingPong(ctx, src, dst, warmup, iters, cfg.timeout, poll)
	if err != nil {
		return err
	}

	st, ms := src.Stats(), src.MetaStats()
	rows := []perf.LatencyStats{
		perf.Latency(0, []time.Duration{up}), perf.Latency(0, cold), perf.Latency(0, warm), perf.Latency(0, rc),
		perf.Latency(8, reads), perf.Latency(8, writes), perf.Latency(vqTwoSidedSize, rtts),
	}
	for i, l := range []string{stepUp, stepCold, stepWarm, stepRC, stepRead, stepWrite, stepSendRTT} {
		rows[i].Label = l
	}
	route := "DC"
	if st.RCs > 0 {
		route = fmt.Sprintf("RC (built in the background once the peer was hot; %d migrations)", st.Migrations)
	}
	return out.Add(perf.Result{Title: testClusterTitle, Test: testCluster, Mode: perf.ModeLat, Column: "step", Placement: placementInproc,
		Info: []perf.Field{
			{Key: "Cluster", Value: fmt.Sprintf("%d nodes, each a soft RNIC and a KRCore runtime, on one in-memory fabric; up in %.2f ms; node 1 embeds the MetaServer, every node registered its DC target there", n, float64(up)/float64(time.Millisecond))},
			{Key: "Connect", Value: fmt.Sprintf("node %d -> node %d. cold: the runtime forgot node %d, one READ of node 1's MetaServer, no handshake with node %d; warm: peer cached; rc_connect: raw RC between the same two RNICs (an RC QP on each, endpoints over loopback TCP, INIT/RTR/RTS on both)", srcID, dstID, dstID, dstID)},
			{Key: "One-sided", Value: fmt.Sprintf("node %d READ %q from node %d's exported region \"greeting\", WROTE %q there and node %d's memory shows it", srcID, readBack, dstID, scribble, dstID)},
			{Key: "Two-sided", Value: fmt.Sprintf("node %d port %d SENDs %d B to node %d port %d, whose VQ echoes it back; every echo's sequence number checked; both wait with %s", srcID, tourPingPort, vqTwoSidedSize, dstID, tourEchoPort, poll)},
			{Key: "Node " + fmt.Sprint(srcID), Value: fmt.Sprintf("%d connects (%d cold, %d MetaServer READs), VQ route %s", st.Connects, st.ColdConnects, ms.Reads, route)},
			{Key: "Steps", Value: fmt.Sprintf("connects interleaved in %d blocks; %d iterations per step after %d warm-up", interleave.Blocks, iters, warmup)},
		},
		Latency: rows,
	})
}

// itersOr is cfg.iters' measured count.
func (cfg *config) itersOr(mode string, size int) int {
	it, _ := cfg.iters(mode, size)
	return it
}

// tourPingPong runs warmup+iters VQ round trips from src to an echo on
// dst, the echo in a goroutine this function owns.
func tourPingPong(ctx context.Context, src, dst *core.Runtime, warmup, iters int, timeout time.Duration, poll vqrun.Poll) ([]time.Duration, error) {
	echo, err := vqrun.NewEcho(core.Embed(dst), tourEchoPort, poll)
	if err != nil {
		return nil, err
	}
	defer echo.Close()
	pctx, cancel := context.WithTimeout(ctx, timeout)
	ping, err := vqrun.NewPing(pctx, core.Embed(src), tourPingPort, dst.Node(), tourEchoPort, poll)
	cancel()
	if err != nil {
		return nil, err
	}
	defer ping.Close()
	ectx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- echo.Serve(ectx, warmup+iters, timeout) }()
	rtts, err := ping.Run(ctx, vqTwoSidedSize, warmup, iters, timeout)
	if err != nil {
		stop()
	}
	if eerr := <-done; err == nil && eerr != nil {
		err = eerr
	}
	return rtts, err
}
