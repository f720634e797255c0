// Command cluster is krcore's runnable tour: it starts an in-process cluster
// of soft-RNIC nodes with a MetaServer, times a raw RC connection against a
// krcore connect (cold: one MetaServer READ; warm: cached) in the same run,
// and moves data one-sided (READ, WRITE, FETCH_ADD on an exported region)
// and two-sided (an echo service on a bound port) through virtual queues.
//
//	go run ./examples/cluster [-nodes 4] [-n 200]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

func main() {
	nodes := flag.Int("nodes", 4, "nodes in the cluster (at least 3)")
	n := flag.Int("n", 200, "connects to time for each kind")
	flag.Parse()
	if *nodes < 3 || *n < 1 {
		fmt.Fprintln(os.Stderr, "cluster: -nodes must be at least 3 and -n at least 1")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, *nodes, *n); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, nodes, n int) error {
	start := time.Now()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: nodes})
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Printf("cluster: %d nodes on the in-memory soft fabric, MetaServer on node 1, up in %v\n\n", nodes, time.Since(start).Round(time.Microsecond))
	if err := connects(ctx, c, n); err != nil {
		return err
	}
	// From here on the tour is application code: it knows only package
	// krcore, and would run unchanged on krcored (client.Attach).
	if err := oneSided(ctx, core.Embed(c.Node(2)), core.Embed(c.Node(1))); err != nil {
		return err
	}
	return twoSided(ctx, core.Embed(c.Node(3)), core.Embed(c.Node(1)))
}

// connects times raw RC connection set-up and krcore connects in one run.
func connects(ctx context.Context, c *cluster.Cluster, n int) error {
	raw := make([]time.Duration, n)
	for i := range raw {
		d, err := rawConnect(c.Devices[0], c.Devices[1])
		if err != nil {
			return fmt.Errorf("raw RC connect: %w", err)
		}
		raw[i] = d
	}
	a := c.Node(2) // not the MetaServer's node, so cold connects cross the fabric
	q, err := a.Queue()
	if err != nil {
		return err
	}
	defer q.Close()
	cold := make([]time.Duration, n)
	warm := make([]time.Duration, n)
	for i := range cold {
		if err := a.Forget(ctx, 3); err != nil {
			return err
		}
		t := time.Now()
		if err := q.Connect(ctx, 3, nil); err != nil {
			return fmt.Errorf("cold connect: %w", err)
		}
		cold[i] = time.Since(t)
		t = time.Now()
		if err := q.Connect(ctx, 3, nil); err != nil {
			return fmt.Errorf("warm connect: %w", err)
		}
		warm[i] = time.Since(t)
	}
	r, cd, w := median(raw), median(cold), median(warm)
	fmt.Printf("connect (median of %d)            latency   vs raw RC\n", n)
	fmt.Printf("  raw RC (create, exchange, RTR/RTS) %9v   1x\n", r)
	fmt.Printf("  krcore cold (one MetaServer READ)  %9v   %.0fx faster\n", cd, float64(r)/float64(cd))
	fmt.Printf("  krcore warm (cached DC target)     %9v   %.0fx faster\n\n", w, float64(r)/float64(w))
	return nil
}

// rawConnect does what a verbs program does to talk to a peer: both sides
// create a PD, CQ and RC QP, exchange endpoints and move to RTS.
func rawConnect(da, db verbs.Device) (time.Duration, error) {
	start := time.Now()
	type side struct {
		pd verbs.PD
		cq verbs.CQ
		qp verbs.QP
	}
	mk := func(d verbs.Device) (s side, err error) {
		if s.pd, err = d.AllocPD(); err != nil {
			return s, err
		}
		if s.cq, err = d.CreateCQ(16); err != nil {
			return s, err
		}
		s.qp, err = s.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: s.cq, RecvCQ: s.cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16}})
		return s, err
	}
	x, errx := mk(da)
	y, erry := mk(db)
	err := errors.Join(errx, erry)
	if err == nil {
		err = errors.Join(verbs.Connect(x.qp, y.qp.Endpoint(), verbs.Path{}), verbs.Connect(y.qp, x.qp.Endpoint(), verbs.Path{}))
	}
	d := time.Since(start)
	for _, s := range []side{x, y} {
		if s.qp != nil {
			s.qp.Close()
		}
		if s.cq != nil {
			s.cq.Close()
		}
		if s.pd != nil {
			s.pd.Close()
		}
	}
	return d, err
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// oneSided: node 2 exports a region, node 1 reads, writes and counts in it
// without node 2 running any code.
func oneSided(ctx context.Context, server, client krcore.API) error {
	mem, err := server.RegMR(4096, verbs.AccessAll)
	if err != nil {
		return err
	}
	copy(mem.Bytes(), "value-of-key-42")
	if err := server.Export("kv", mem, 0, 4096, verbs.AccessRemoteRead|verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic); err != nil {
		return err
	}
	g, err := client.Region(ctx, server.Node(), "kv")
	if err != nil {
		return err
	}
	q, err := client.Queue()
	if err != nil {
		return err
	}
	defer q.Close()
	if err := q.Connect(ctx, server.Node(), nil); err != nil {
		return err
	}
	buf, err := client.RegMR(64, verbs.AccessAll)
	if err != nil {
		return err
	}
	copy(buf.Bytes()[32:], "new-value")
	reqs := []krcore.Request{
		{ID: 1, Op: verbs.OpRead, Local: buf.Range(0, 15), Remote: g.At(0)},
		{ID: 2, Op: verbs.OpWrite, Local: buf.Range(32, 9), Remote: g.At(100)},
		{ID: 3, Op: verbs.OpFetchAdd, Local: buf.Range(56, 8), Remote: g.At(1024), Compare: 1},
	}
	start := time.Now()
	if _, err := q.Push(ctx, true, reqs...); err != nil {
		return err
	}
	out := make([]krcore.Completion, len(reqs))
	for got := 0; got < len(reqs); {
		k, err := q.PopWait(ctx, out[got:])
		if err != nil {
			return err
		}
		got += k
	}
	d := time.Since(start)
	for _, wc := range out {
		if err := wc.Err(); err != nil {
			return err
		}
	}
	fmt.Printf("one-sided (node 1 -> region \"kv\" on node 2), 3 requests in %v:\n", d.Round(time.Nanosecond))
	fmt.Printf("  READ      got %q\n  WRITE     node 2 now holds %q\n  FETCH_ADD counter now %d\n\n",
		buf.Bytes()[:15], mem.Bytes()[100:109], mem.Bytes()[1024])
	return nil
}

// twoSided: node 3 runs an echo service on port 7; node 1 sends to it.
func twoSided(ctx context.Context, srvRT, cliRT krcore.API) error {
	srv, err := srvRT.Queue()
	if err != nil {
		return err
	}
	defer srv.Close()
	if err := srv.Bind(7); err != nil {
		return err
	}
	in, _ := srvRT.RegMR(4096, verbs.AccessLocalWrite)
	srv.PushRecv(in.Range(0, 4096))
	cli, err := cliRT.Queue()
	if err != nil {
		return err
	}
	defer cli.Close()
	if err := cli.Bind(8); err != nil {
		return err
	}
	if err := cli.Connect(ctx, srvRT.Node(), &krcore.ConnectOptions{Port: 7}); err != nil {
		return err
	}
	reply, _ := cliRT.RegMR(4096, verbs.AccessLocalWrite)
	cli.PushRecv(reply.Range(0, 4096))
	msg, _ := cliRT.RegMR(64, verbs.AccessLocalWrite)
	n := copy(msg.Bytes(), "ping")

	start := time.Now()
	if _, err := cli.Push(ctx, true, krcore.Request{ID: 1, Op: verbs.OpSend, Local: msg.Range(0, n)}); err != nil {
		return err
	}
	var m [1]krcore.Message
	if _, err := srv.PopMsgsWait(ctx, m[:]); err != nil {
		return err
	}
	// Echo: answer on a queue connected to the sender's node and port.
	back, _ := srvRT.Queue()
	defer back.Close()
	if err := back.Connect(ctx, m[0].From, &krcore.ConnectOptions{Port: m[0].Port}); err != nil {
		return err
	}
	pong, _ := srvRT.RegMR(64, verbs.AccessLocalWrite)
	k := copy(pong.Bytes(), "pong to ")
	k += copy(pong.Bytes()[k:], in.Bytes()[:m[0].Len])
	if _, err := back.Push(ctx, true, krcore.Request{ID: 2, Op: verbs.OpSend, Local: pong.Range(0, k)}); err != nil {
		return err
	}
	if _, err := cli.PopMsgsWait(ctx, m[:]); err != nil {
		return err
	}
	fmt.Printf("two-sided (node 1 port 8 <-> node 3 port 7): sent %q, got %q back in %v\n",
		msg.Bytes()[:n], reply.Bytes()[:m[0].Len], time.Since(start).Round(time.Nanosecond))
	return nil
}
