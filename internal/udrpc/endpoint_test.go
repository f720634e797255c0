package udrpc_test

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/udrpc"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// Test messages: a kind byte (1 request, 2 reply), then the id.
func replyID(msg []byte) (uint64, bool) {
	if len(msg) < 9 || msg[0] != 2 {
		return 0, false
	}
	return binary.LittleEndian.Uint64(msg[1:]), true
}

func frame(kind byte, id uint64) []byte {
	return binary.LittleEndian.AppendUint64([]byte{kind}, id)
}

// side is one endpoint with what a test needs around it.
type side struct {
	dev verbs.Device
	pd  verbs.PD
	ep  *udrpc.Endpoint
}

func newSide(t *testing.T, fab *soft.Fabric, cfg udrpc.Config) *side {
	t.Helper()
	dev, err := fab.NewNode(soft.Config{RetryTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cfg.QKey, cfg.ReplyID = 0x1234, replyID
	ep, err := udrpc.New(dev, pd, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ep.Close()
		pd.Close()
		dev.Close()
	})
	return &side{dev: dev, pd: pd, ep: ep}
}

// dest addresses s's endpoint from pd.
func (s *side) dest(t *testing.T, pd verbs.PD) udrpc.Dest {
	t.Helper()
	ah, err := pd.CreateAH(verbs.AHAttr{Dest: verbs.Endpoint{Addr: s.dev.Port().Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ah.Close() })
	return udrpc.Dest{AH: ah, QPN: s.ep.QPN()}
}

// server answers every request but the first copy of each id when lossy,
// from a goroutine it owns, until ctx ends.
func server(t *testing.T, ctx context.Context, fab *soft.Fabric, lossy bool) (*side, *atomic.Int32) {
	var mu sync.Mutex
	var reqs [][]byte
	work := make(chan struct{}, 1)
	s := newSide(t, fab, udrpc.Config{OnRequest: func(m []byte) {
		mu.Lock()
		reqs = append(reqs, m)
		mu.Unlock()
		select {
		case work <- struct{}{}:
		default:
		}
	}})
	var seen atomic.Int32
	var wg sync.WaitGroup
	wg.Add(1)
	t.Cleanup(wg.Wait)
	go func() {
		defer wg.Done()
		back := map[uint64]bool{}
		for s.ep.Wait(ctx, work) == nil {
			mu.Lock()
			batch := reqs
			reqs = nil
			mu.Unlock()
			for _, m := range batch {
				seen.Add(1)
				id := binary.LittleEndian.Uint64(m[1:])
				if lossy && !back[id] {
					back[id] = true
					continue // drop the first copy
				}
				// The client's endpoint QPN travels after the id.
				qpn := binary.LittleEndian.Uint32(m[9:])
				s.ep.Send(ctx, udrpc.Dest{AH: clientAH(t, s, m), QPN: qpn}, frame(2, id))
			}
		}
	}()
	return s, &seen
}

var ahs sync.Map // by address: the server's AHs back to clients

func clientAH(t *testing.T, s *side, m []byte) verbs.AH {
	addr := string(m[13:])
	if ah, ok := ahs.Load(addr); ok {
		return ah.(verbs.AH)
	}
	ah, err := s.pd.CreateAH(verbs.AHAttr{Dest: verbs.Endpoint{Addr: addr}})
	if err != nil {
		t.Error(err)
		return nil
	}
	ahs.Store(addr, ah)
	return ah
}

func request(c *side, id uint64) []byte {
	b := binary.LittleEndian.AppendUint32(frame(1, id), c.ep.QPN())
	return append(b, c.dev.Port().Addr...)
}

// TestCall: a call gets its reply; a dropped request is sent again with
// the same id and answered.
func TestCall(t *testing.T) {
	for _, lossy := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		fab := soft.NewFabric()
		srv, seen := server(t, ctx, fab, lossy)
		c := newSide(t, fab, udrpc.Config{Timeout: 10 * time.Millisecond})
		to := srv.dest(t, c.pd)
		for id := uint64(1); id <= 3; id++ {
			rep, err := c.ep.Call(ctx, to, id, request(c, id))
			if err != nil {
				t.Fatalf("lossy %v: call %d: %v", lossy, id, err)
			}
			if got, _ := replyID(rep); got != id {
				t.Fatalf("reply to %d answers %d", id, got)
			}
		}
		if want := int32(3); lossy {
			want = 6
			if n := seen.Load(); n != want {
				t.Fatalf("lossy server saw %d requests, want %d", n, want)
			}
		}
		cancel()
	}
}

// TestNoReply: calls to a QP nobody serves fail with ErrNoReply after the
// attempts; after Close they fail with Config.Closed.
func TestNoReply(t *testing.T) {
	fab := soft.NewFabric()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dumb := newSide(t, fab, udrpc.Config{})
	c := newSide(t, fab, udrpc.Config{Timeout: time.Millisecond, Attempts: 3})
	if _, err := c.ep.Call(ctx, dumb.dest(t, c.pd), 1, request(c, 1)); !errors.Is(err, udrpc.ErrNoReply) {
		t.Fatalf("call to a silent peer: %v", err)
	}
	c.ep.Shutdown()
	if _, err := c.ep.Call(ctx, dumb.dest(t, c.pd), 2, request(c, 2)); !errors.Is(err, udrpc.ErrClosed) {
		t.Fatalf("call after Shutdown: %v", err)
	}
}

// TestRecoverInPlace: a datagram that breaks the QP (to a node that is
// gone) is followed by a working call on the same QP number.
func TestRecoverInPlace(t *testing.T) {
	fab := soft.NewFabric()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv, _ := server(t, ctx, fab, false)
	c := newSide(t, fab, udrpc.Config{Timeout: 20 * time.Millisecond})
	gone := newSide(t, fab, udrpc.Config{})
	to, lost := srv.dest(t, c.pd), gone.dest(t, c.pd)
	gone.dev.Close()
	qpn := c.ep.QPN()
	c.ep.Call(ctx, lost, 1, request(c, 1)) // may break the QP, depending on the provider
	if _, err := c.ep.Call(ctx, to, 2, request(c, 2)); err != nil {
		t.Fatalf("call after a send to a dead node: %v", err)
	}
	if c.ep.QPN() != qpn {
		t.Fatalf("QPN changed from %d to %d", qpn, c.ep.QPN())
	}
}

// TestSilentBeforeDeadline: a call whose context's deadline ends it after
// several whole attempts went unanswered says the peer was silent
// (ErrNoReply, and the deadline); one that the deadline ends before that
// says only the deadline.
func TestSilentBeforeDeadline(t *testing.T) {
	fab := soft.NewFabric()
	dumb := newSide(t, fab, udrpc.Config{})
	c := newSide(t, fab, udrpc.Config{Timeout: 5 * time.Millisecond, Attempts: 20})
	for _, tc := range []struct {
		deadline time.Duration
		silent   bool
	}{{2 * time.Millisecond, false}, {200 * time.Millisecond, true}} {
		ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
		_, err := c.ep.Call(ctx, dumb.dest(t, c.pd), 1, request(c, 1))
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, udrpc.ErrNoReply) != tc.silent {
			t.Errorf("call to a silent peer ended by a %v deadline: %v; want DeadlineExceeded, ErrNoReply %v", tc.deadline, err, tc.silent)
		}
	}
}

// TestSendsWithoutPoller: a goroutine that only sends (a server answering
// a burst of requests, with no call of its own polling the endpoint) is
// never held for a send buffer that only a poll of the completion queue
// would free: more datagrams than the endpoint has send buffers go out at
// once.
func TestSendsWithoutPoller(t *testing.T) {
	fab := soft.NewFabric()
	rx := newSide(t, fab, udrpc.Config{})
	tx := newSide(t, fab, udrpc.Config{Depth: 4})
	to := rx.dest(t, tx.pd)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	t0 := time.Now()
	for i := range 20 {
		if err := tx.ep.Send(ctx, to, frame(1, uint64(i))); err != nil {
			t.Fatalf("send %d of 20 with 4 send buffers and nobody polling: %v", i, err)
		}
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("20 sends took %v", d)
	}
}

// qpCatcher is a PD that keeps the QP it creates, so a test can break it.
type qpCatcher struct {
	verbs.PD
	qp verbs.QP
}

func (p *qpCatcher) CreateQP(init verbs.QPInit) (verbs.QP, error) {
	qp, err := p.PD.CreateQP(init)
	p.qp = qp
	return qp, err
}

// TestServerRecoversBrokenQP: an endpoint that only answers requests,
// whose QP goes to ERR under its receives, recovers it and answers the
// next request. Recovered only on a send, it never heard a request again,
// so never sent: its peers' calls went unanswered for good.
func TestServerRecoversBrokenQP(t *testing.T) {
	fab := soft.NewFabric()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dev, err := fab.NewNode(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	inner, _ := dev.AllocPD()
	defer inner.Close()
	pd := &qpCatcher{PD: inner}
	work := make(chan struct{}, 1)
	var mu sync.Mutex
	var reqs [][]byte
	ep, err := udrpc.New(dev, pd, udrpc.Config{QKey: 0x1234, ReplyID: replyID, OnRequest: func(m []byte) {
		mu.Lock()
		reqs = append(reqs, m)
		mu.Unlock()
		select {
		case work <- struct{}{}:
		default:
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &side{dev: dev, pd: pd, ep: ep}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ep.Close()
	defer cancel()
	wg.Add(1)
	go func() { // answers every request, and sends nothing else
		defer wg.Done()
		for ep.Wait(ctx, work) == nil {
			mu.Lock()
			batch := reqs
			reqs = nil
			mu.Unlock()
			for _, m := range batch {
				id, qpn := binary.LittleEndian.Uint64(m[1:]), binary.LittleEndian.Uint32(m[9:])
				ep.Send(ctx, udrpc.Dest{AH: clientAH(t, srv, m), QPN: qpn}, frame(2, id))
			}
		}
	}()
	c := newSide(t, fab, udrpc.Config{Timeout: 10 * time.Millisecond})
	to := srv.dest(t, c.pd)
	if _, err := c.ep.Call(ctx, to, 1, request(c, 1)); err != nil {
		t.Fatalf("call before the break: %v", err)
	}
	if err := pd.qp.Modify(verbs.QPAttr{State: verbs.StateErr}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ep.Call(ctx, to, 2, request(c, 2)); err != nil {
		t.Fatalf("call after the server's QP broke: %v", err)
	}
}

// TestCloseWaitsForLeader: Close does not release the receive buffers
// while a caller's goroutine, leading the poller, is still handling a
// message in one of them (a runtime closing under its applications' calls
// once faulted there, in ReplyID); the leader then fails with
// Config.Closed.
func TestCloseWaitsForLeader(t *testing.T) {
	fab := soft.NewFabric()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sender := newSide(t, fab, udrpc.Config{})
	dev, err := fab.NewNode(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pd.Close()
		dev.Close()
	})
	inDispatch, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	ep, err := udrpc.New(dev, pd, udrpc.Config{QKey: 0x1234, ReplyID: func([]byte) (uint64, bool) {
		once.Do(func() {
			close(inDispatch)
			<-gate
		})
		return 0, true // a reply nobody waits for: nothing more is read
	}})
	if err != nil {
		t.Fatal(err)
	}
	led := make(chan error, 1)
	go func() { led <- ep.Wait(ctx, make(chan struct{})) }()
	s := &side{dev: dev, pd: pd, ep: ep}
	if err := sender.ep.Send(ctx, s.dest(t, sender.pd), frame(2, 7)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-inDispatch:
	case <-ctx.Done():
		t.Fatal("the leader never handled the message")
	}
	closed := make(chan error, 1)
	go func() { closed <- ep.Close() }()
	select {
	case err := <-closed:
		t.Error("Close returned while the leader was handling a message in a receive buffer")
		closed <- err
	case <-time.After(200 * time.Millisecond): // Close must still be waiting
	}
	close(gate)
	select {
	case err := <-led:
		if !errors.Is(err, udrpc.ErrClosed) {
			t.Errorf("the leader's wait: %v, want ErrClosed", err)
		}
	case <-ctx.Done():
		t.Fatal("the leader never left")
	}
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("Close never returned")
	}
}
