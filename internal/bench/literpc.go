package bench

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/rpc"
	"sync"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/bench/interleave"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/internal/bench/vqrun"
	"github.com/krcore/krcore/internal/liteapp"
	"github.com/krcore/krcore/internal/perf"
	"github.com/krcore/krcore/lite"
	"github.com/krcore/krcore/verbs"
)

// The lite-rpc series: 8 B round trips of a lite RPC Call (rpc) against a
// SEND round trip through VQs between the same two nodes (vq_send) and a
// Go net/rpc call over TCP between the same two processes (net_rpc), and
// lite RPC calls per second from 1 and from liteCallers goroutines.
const (
	testLiteRPC    = "lite-rpc"
	seriesLiteRPC  = "rpc"
	seriesVQSendRT = "vq_send"
	seriesNetRPC   = "net_rpc"
	liteRPCEcho    = 1 // the master's echo RPC id
	liteRPCSize    = 8
	liteRPCServers = 2 // goroutines serving the echo RPC
	liteCallers    = 8
	// LITE's RPC is one WRITE_WITH_IMM each way: about a SEND round trip,
	// and well under a kernel TCP RPC stack's.
	targetRPCVsSend   = 1.2
	targetRPCVsNetRPC = 0.5
)

// LiteEcho is the Go net/rpc echo service of the lite-rpc series.
type LiteEcho struct{}

// Echo answers req with itself.
func (LiteEcho) Echo(req []byte, resp *[]byte) error {
	*resp = req
	return nil
}

// liteEchoes are the master's echo servers for lite-rpc: the lite RPC
// service, a VQ echo on echoPort, and Go net/rpc on loopback TCP.
type liteEchoes struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	svc    *lite.Service
	rawSvc *lite.Service // sets up raw-QP echoes (literaw.go)
	echo   *vqrun.Echo
	ln     net.Listener
}

// startEchoes starts the echo servers on api and the master's Node n,
// and the raw-QP echoes on dev.
func startEchoes(api krcore.API, dev verbs.Device, n *lite.Node) (_ *liteEchoes, err error) {
	ctx, cancel := context.WithCancel(context.Background())
	e := &liteEchoes{cancel: cancel}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if e.svc, err = n.RegisterRPC(liteRPCEcho); err != nil {
		return nil, err
	}
	if e.rawSvc, err = n.RegisterRPC(liteRPCRawQP); err != nil {
		return nil, err
	}
	e.run(func() { e.serveRawQP(ctx, dev, e.rawSvc) })
	if e.echo, err = vqrun.NewEcho(api, echoPort, vqrun.Poll{}); err != nil {
		return nil, err
	}
	if e.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return nil, err
	}
	srv := rpc.NewServer()
	if err = srv.Register(LiteEcho{}); err != nil {
		return nil, err
	}
	e.run(func() { liteapp.ServeRPC(srv, e.ln) })
	for range liteRPCServers {
		e.run(func() {
			call, err := e.svc.Recv(ctx)
			for err == nil {
				call, err = e.svc.ReplyRecv(ctx, call, call.Req)
			}
		})
	}
	e.run(func() {
		for ctx.Err() == nil {
			e.echo.Serve(ctx, math.MaxInt, time.Second) // ends at each idle second
		}
	})
	return e, nil
}

// run runs f on a goroutine close waits for.
func (e *liteEchoes) run(f func()) {
	e.wg.Add(1)
	go func() { defer e.wg.Done(); f() }()
}

// close stops the servers and waits for their goroutines.
func (e *liteEchoes) close() {
	e.cancel()
	for _, svc := range []*lite.Service{e.svc, e.rawSvc} {
		if svc != nil {
			svc.Close()
		}
	}
	if e.ln != nil {
		e.ln.Close()
	}
	e.wg.Wait()
	if e.echo != nil {
		e.echo.Close()
	}
}

// openRPC connects a side's VQ ping to the master's echo and, for the
// embedded side (whose RNIC is dev), a net/rpc client to rpcAddr and a raw
// QP to the master's RNIC.
func (s *liteSide) openRPC(ctx context.Context, master krcore.NodeID, rpcAddr string, dev verbs.Device, timeout time.Duration) error {
	var err error
	if s.ping, err = vqrun.NewPing(ctx, s.api, clientPort, master, echoPort, vqrun.Poll{}); err != nil {
		return err
	}
	if s.suffix != "" {
		return nil
	}
	if s.netrpc, err = rpc.Dial("tcp", rpcAddr); err != nil {
		return err
	}
	return s.openRawQP(ctx, dev, master, timeout)
}

// rpcs is the lite-rpc table and the calls/s figures.
func (b *liteBench) rpcs(dl *rawqp.Deadline, place string, master krcore.NodeID, sides []*liteSide, nodes string) error {
	var series []*interleave.Latency
	var labels []string
	for _, s := range sides {
		req, resp := make([]byte, liteRPCSize), make([]byte, liteRPCSize)
		series = append(series,
			&interleave.Latency{Run: func(w, n int) ([]time.Duration, error) {
				return timed(dl, w, n, func(ctx context.Context) error {
					_, err := s.node.Call(ctx, master, liteRPCEcho, req, resp)
					return err
				})
			}},
			&interleave.Latency{Run: func(w, n int) ([]time.Duration, error) {
				return s.ping.Run(b.ctx, liteRPCSize, w, n, b.c.timeout)
			}})
		labels = append(labels, seriesLiteRPC+s.suffix, seriesVQSendRT+s.suffix)
		if s.netrpc != nil {
			var out []byte
			series = append(series, &interleave.Latency{Run: func(w, n int) ([]time.Duration, error) {
				return timed(dl, w, n, func(context.Context) error { return s.netrpc.Call("LiteEcho.Echo", req, &out) })
			}}, &interleave.Latency{Run: func(w, n int) ([]time.Duration, error) {
				return s.raw.PingPongOp(s.rawPoll, rawqp.Spec{Op: verbs.OpSend, Size: liteRPCSize}, w, n)
			}})
			labels = append(labels, seriesNetRPC, seriesQPSendRT)
		}
	}
	err := b.rotate(place, testLiteRPC, "LITE RPC vs raw-QP SEND vs VQ SEND vs Go net/rpc round trip, 8 B (interleaved)", liteRPCSize, b.c.n, series, labels, []perf.Field{
		{Key: "Series", Value: "rpc: lite Node.Call of the master's echo RPC (one WRITE_WITH_IMM each way); qp_send: a SEND on a raw RC QP between the embedded mapper's and the master's RNICs and the echo's SEND back (both wait on their CQ without spinning); vq_send: the same through a VQ to the master node's echo port; net_rpc: Go net/rpc over loopback TCP to the master's process; *_daemon: through krcored"},
		{Key: "Nodes", Value: nodes},
		{Key: "Servers", Value: fmt.Sprintf("%d goroutines serve the echo RPC (ReplyRecv); one the VQ echo; net/rpc a goroutine per connection", liteRPCServers)},
	})
	if err != nil {
		return err
	}
	for _, s := range sides {
		if err := b.callRates(dl, place, master, s); err != nil {
			return err
		}
	}
	return nil
}

// callRates adds the side's lite RPC calls/s with 1 and liteCallers
// goroutines, each the median of 3 rounds in alternating order.
func (b *liteBench) callRates(dl *rawqp.Deadline, place string, master krcore.NodeID, s *liteSide) error {
	per := max(b.c.n*5, liteCallers)
	rates := map[int][]float64{}
	for _, round := range [][]int{{1, liteCallers}, {liteCallers, 1}, {1, liteCallers}} {
		for _, g := range round {
			r, err := s.callRate(dl, master, g, per)
			if err != nil {
				return fmt.Errorf("%s lite RPC calls/s%s, %d callers: %w", place, s.suffix, g, err)
			}
			rates[g] = append(rates[g], r)
		}
	}
	via := "embedded"
	if s.suffix != "" {
		via = "through krcored"
	}
	for _, g := range []int{1, liteCallers} {
		b.out.AddFigures(perf.Figure(fmt.Sprintf("%s %s: lite RPC 8B calls/s, %d caller(s) (median of 3 rounds)", place, via, g), median(rates[g])/1e3, " K/s"))
	}
	return nil
}

// callRate runs total calls from callers goroutines and returns calls/s.
// The goroutines share one context, taken before they start: a Deadline is
// one goroutine's (its Get cancels the context it handed out before).
func (s *liteSide) callRate(dl *rawqp.Deadline, master krcore.NodeID, callers, total int) (float64, error) {
	errs := make(chan error, callers)
	ctx := dl.Get()
	t0 := time.Now()
	for g := range callers {
		go func() {
			req, resp := make([]byte, liteRPCSize), make([]byte, liteRPCSize)
			var err error
			for i := g; i < total && err == nil; i += callers {
				_, err = s.node.Call(ctx, master, liteRPCEcho, req, resp)
			}
			errs <- err
		}()
	}
	var first error
	for range callers {
		first = firstErr(first, <-errs)
	}
	return float64(total) / time.Since(t0).Seconds(), first
}
