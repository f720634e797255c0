package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/internal/bench/control"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/internal/liteapp"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// Modes: how the two functions move the state.
const (
	modeDaemon   = "krcored"  // both attach to their node's krcored
	modeEmbedded = "embedded" // each starts a soft RNIC and a runtime of its own
	modeRaw      = "raw"      // each opens a soft RNIC and builds an RC QP itself
	modeTCP      = "tcp"      // the consumer dials the producer and reads a stream
)

// report is what a function process says when it is ready (the producer)
// or done (the consumer), as JSON. The phases are ns a function spent,
// each lapped off its clock as it went (lapper).
type report struct {
	Main     int64  `json:"main"`     // wall clock at main, ns since the epoch
	Connect  int64  `json:"connect"`  // attach or start a runtime, open the RNIC, QPs, exchange, Connect, Region, listen, dial
	Attach   int64  `json:"attach"`   // of Connect: attach to krcored or start a runtime (openAPI)
	Register int64  `json:"register"` // register memory, export it
	Produce  int64  `json:"produce"`  // producer: write the state
	Transfer int64  `json:"transfer"` // consumer: move the state
	Addr     string `json:"addr"`     // producer: where the consumer finds it (raw, tcp)
	Procs    int    `json:"procs"`    // the GOMAXPROCS it ran with
}

// lapper charges the time since its last lap to one phase of a report.
type lapper struct{ last time.Time }

func newLapper() *lapper { return &lapper{last: time.Now()} }

// lap adds the time since the last lap to *phase.
func (l *lapper) lap(phase *int64) {
	now := time.Now()
	*phase += int64(now.Sub(l.last))
	l.last = now
}

// fnArgs is a function process's command line.
type fnArgs struct {
	role, mode, sock, meta, name, addr string
	size, node, peer, procs            int
	seed                               uint64
}

// function is a function process: the producer or the consumer of one
// invocation, in mode.
func function(_ int, argv []string) error {
	a, err := parseFn(argv)
	if err != nil {
		return err
	}
	if a.procs > 0 {
		runtime.GOMAXPROCS(a.procs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if a.role == "producer" {
		return produce(ctx, a)
	}
	return consume(ctx, a)
}

// say is liteapp.Serve with r as the ready line; the process then lives
// until the runner closes its input, when after (if set) runs.
func say(r report, after func() error) error {
	r.Procs = runtime.GOMAXPROCS(0)
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	err = liteapp.Serve(string(b), func(string) (string, error) { return "", nil })
	if after != nil {
		err = errors.Join(err, after())
	}
	return err
}

// fill writes invocation seed's state into b: what the consumer checks.
func fill(b []byte, seed uint64) {
	x := seed | 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
}

// check reports whether b is invocation seed's state.
func check(b []byte, seed uint64) error {
	want := make([]byte, len(b))
	fill(want, seed)
	for i := range b {
		if b[i] != want[i] {
			return fmt.Errorf("state byte %d of %d is %#x, want %#x", i, len(b), b[i], want[i])
		}
	}
	return nil
}

// produce is the producer: it makes the state where the consumer can take
// it, says so, and keeps it there until the runner ends it.
func produce(ctx context.Context, a fnArgs) error {
	clock := newLapper()
	var r report
	var release func() error
	var err error
	switch a.mode {
	case modeDaemon, modeEmbedded:
		var api krcore.API
		if api, release, err = openAPI(ctx, a); err == nil {
			r.Attach = int64(time.Since(clock.last))
			clock.lap(&r.Connect)
			err = exportState(api, a, &r, clock)
		}
	case modeRaw:
		release, err = serveRaw(ctx, a, &r, clock)
	case modeTCP:
		release, err = serveTCP(a, &r, clock)
	}
	if err != nil {
		if release != nil {
			release()
		}
		return err
	}
	r.Main = mainAt.UnixNano()
	return say(r, release)
}

// consume is the consumer: it reaches the producer's state and takes it,
// says so (which ends the invocation's time), then checks the state and
// releases what it used.
func consume(ctx context.Context, a fnArgs) error {
	r := report{Main: mainAt.UnixNano()}
	var got []byte
	var release func() error
	var err error
	switch a.mode {
	case modeDaemon, modeEmbedded:
		got, release, err = readKrcore(ctx, a, &r)
	case modeRaw:
		got, release, err = readRaw(ctx, a, &r)
	case modeTCP:
		got, release, err = readTCP(ctx, a, &r)
	}
	if err != nil {
		return err
	}
	return say(r, func() error { return errors.Join(check(got, a.seed), release()) })
}

// openAPI is the function's krcore: its node's krcored, or a runtime of
// its own on a soft RNIC of its own.
func openAPI(ctx context.Context, a fnArgs) (krcore.API, func() error, error) {
	if a.mode == modeDaemon {
		cl, err := client.Attach(ctx, client.Options{Socket: a.sock})
		if err != nil {
			return nil, nil, err
		}
		return cl, cl.Close, nil
	}
	info, err := meta.ParseInfo(a.meta)
	if err != nil {
		return nil, nil, fmt.Errorf("-meta: %w", err)
	}
	n, err := liteapp.StartNode(ctx, krcore.NodeID(a.node), []meta.Info{info})
	if err != nil {
		return nil, nil, err
	}
	return core.Embed(n.Runtime), n.Close, nil
}

// exportState registers the state's memory, writes the state there and
// exports it under a.name, read-only.
func exportState(api krcore.API, a fnArgs, r *report, clock *lapper) error {
	mr, err := api.RegMR(a.size, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		return err
	}
	clock.lap(&r.Register)
	fill(mr.Bytes()[:a.size], a.seed)
	clock.lap(&r.Produce)
	err = api.Export(a.name, mr, 0, a.size, verbs.AccessRemoteRead)
	clock.lap(&r.Register)
	return err
}

// readKrcore connects a VQ to the producer's node, learns its region and
// READs it whole into an MR; release closes the queue and the runtime.
func readKrcore(ctx context.Context, a fnArgs, r *report) (_ []byte, release func() error, err error) {
	clock := newLapper()
	api, closeAPI, err := openAPI(ctx, a)
	if err != nil {
		return nil, nil, err
	}
	r.Attach = int64(time.Since(clock.last))
	q, region, err := krcore.QueueTo(ctx, api, krcore.NodeID(a.peer), nil, a.name)
	if err != nil {
		closeAPI()
		return nil, nil, err
	}
	release = func() error { return errors.Join(q.Close(), closeAPI()) }
	defer func() {
		if err != nil {
			release()
		}
	}()
	clock.lap(&r.Connect)
	buf, err := api.RegMR(a.size, verbs.AccessLocalWrite)
	if err != nil {
		return nil, nil, err
	}
	clock.lap(&r.Register)
	req := krcore.Request{ID: 1, Op: verbs.OpRead, Local: buf.Range(0, a.size), Remote: region.At(0)}
	if _, err := q.Push(ctx, true, req); err != nil {
		return nil, nil, err
	}
	var out [1]krcore.Completion
	if _, err := q.PopWait(ctx, out[:]); err != nil {
		return nil, nil, err
	}
	if err := out[0].Err(); err != nil {
		return nil, nil, fmt.Errorf("READ %d B: %w", a.size, err)
	}
	clock.lap(&r.Transfer)
	return buf.Bytes()[:a.size], release, nil
}

// rawHello is the raw-RC exchange: a side's QP endpoint and, from the
// producer, its MR.
type rawHello struct {
	EP []byte      `json:"ep"`
	MR *control.MR `json:"mr,omitempty"`
}

// rawSide is a function's own RNIC and RC endpoint over its buffer.
type rawSide struct {
	dev *soft.Node
	buf *offheap.Block
	ep  *rawqp.Endpoint
}

// openRaw opens a soft RNIC reachable from other processes and creates
// PD, CQ and an RC QP (connect), then registers a buffer of size bytes
// (register), which seed's state fills first on the producer (produce).
func openRaw(size int, producer bool, seed uint64, r *report, clock *lapper) (_ *rawSide, err error) {
	s := &rawSide{ep: &rawqp.Endpoint{}}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.dev, err = soft.NewNode(soft.Config{Listen: "127.0.0.1:0"}); err != nil {
		return nil, err
	}
	if s.ep.PD, err = s.dev.AllocPD(); err != nil {
		return nil, err
	}
	if s.ep.CQ, err = s.dev.CreateCQ(16); err != nil {
		return nil, err
	}
	s.ep.QP, err = s.ep.PD.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: s.ep.CQ, RecvCQ: s.ep.CQ,
		Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return nil, err
	}
	clock.lap(&r.Connect)
	if s.buf, err = rawqp.AllocBuf(size); err != nil {
		return nil, err
	}
	if producer {
		fill(s.buf.Bytes()[:size], seed)
		clock.lap(&r.Produce)
	}
	s.ep.MR, err = s.ep.PD.RegMR(s.buf.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	clock.lap(&r.Register)
	return s, err
}

func (s *rawSide) close() error {
	errs := []error{s.ep.Close()}
	if s.buf != nil {
		errs = append(errs, s.buf.Close())
	}
	if s.dev != nil {
		errs = append(errs, s.dev.Close())
	}
	return errors.Join(errs...)
}

// serveRaw is the raw producer: its RNIC, QP and MR over the state, and a
// TCP listener where one consumer sends its QP endpoint and gets the
// producer's and the MR back.
func serveRaw(ctx context.Context, a fnArgs, r *report, clock *lapper) (func() error, error) {
	s, err := openRaw(a.size, true, a.seed, r, clock)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.close()
		return nil, err
	}
	r.Addr = ln.Addr().String()
	clock.lap(&r.Connect)
	done := make(chan error, 1)
	go func() { done <- acceptRaw(ctx, ln, s) }()
	return func() error {
		ln.Close()
		return errors.Join(<-done, s.close())
	}, nil
}

// acceptRaw answers one consumer's exchange and connects the QP to it.
func acceptRaw(ctx context.Context, ln net.Listener, s *rawSide) error {
	c, err := ln.Accept()
	if err != nil {
		return nil // the runner ended the producer before a consumer came
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	var hello rawHello
	if err := json.NewDecoder(c).Decode(&hello); err != nil {
		return fmt.Errorf("consumer's endpoint: %w", err)
	}
	remote, err := control.UnmarshalEP(hello.EP)
	if err != nil {
		return err
	}
	if err := s.ep.Connect(remote); err != nil {
		return err
	}
	own, err := control.MarshalEP(s.ep.QP)
	if err != nil {
		return err
	}
	return json.NewEncoder(c).Encode(rawHello{EP: own, MR: s.ep.Remote()})
}

// readRaw is the raw consumer: its own RNIC, QP and MR, the exchange with
// the producer over TCP, RTR/RTS, then one READ of the whole state.
func readRaw(ctx context.Context, a fnArgs, r *report) (_ []byte, release func() error, err error) {
	clock := newLapper()
	s, err := openRaw(a.size, false, 0, r, clock)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	own, err := control.MarshalEP(s.ep.QP)
	if err != nil {
		return nil, nil, err
	}
	c, err := dial(ctx, a.addr)
	if err != nil {
		return nil, nil, err
	}
	defer c.Close()
	var peer rawHello
	if err := json.NewEncoder(c).Encode(rawHello{EP: own}); err != nil {
		return nil, nil, err
	}
	if err := json.NewDecoder(c).Decode(&peer); err != nil {
		return nil, nil, fmt.Errorf("producer's endpoint and MR: %w", err)
	}
	if peer.MR == nil {
		return nil, nil, errors.New("the producer sent no MR")
	}
	remote, err := control.UnmarshalEP(peer.EP)
	if err != nil {
		return nil, nil, err
	}
	if err := s.ep.Connect(remote); err != nil {
		return nil, nil, err
	}
	clock.lap(&r.Connect)
	p := rawqp.NewPoller(ctx, s.ep.CQ, 200*time.Microsecond, 30*time.Second, false)
	defer p.Close()
	if _, err := s.ep.Latency(p, rawqp.Spec{Op: verbs.OpRead, Size: a.size, Remote: *peer.MR}, 0, 1); err != nil {
		return nil, nil, err
	}
	clock.lap(&r.Transfer)
	return s.buf.Bytes()[:a.size], s.close, nil
}

// serveTCP is the TCP producer: the state in memory and a listener that
// writes it to one consumer.
func serveTCP(a fnArgs, r *report, clock *lapper) (func() error, error) {
	state := make([]byte, a.size)
	fill(state, a.seed)
	clock.lap(&r.Produce)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r.Addr = ln.Addr().String()
	clock.lap(&r.Connect)
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- nil // ended before a consumer came
			return
		}
		_, err = c.Write(state)
		done <- errors.Join(err, c.Close())
	}()
	return func() error {
		ln.Close()
		return <-done
	}, nil
}

// readTCP is the TCP consumer: dial, then read the whole state.
func readTCP(ctx context.Context, a fnArgs, r *report) (_ []byte, release func() error, err error) {
	clock := newLapper()
	c, err := dial(ctx, a.addr)
	if err != nil {
		return nil, nil, err
	}
	defer c.Close()
	clock.lap(&r.Connect)
	got := make([]byte, a.size)
	if _, err := io.ReadFull(bufio.NewReaderSize(c, 64<<10), got); err != nil {
		return nil, nil, err
	}
	clock.lap(&r.Transfer)
	return got, func() error { return nil }, nil
}

// dial connects to the producer at addr, with ctx's deadline on every
// read and write.
func dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	return c, nil
}
