package remotedev_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// fakeDev is a minimal loopback device for testing the proxy without the
// soft RNIC: QPs follow the RESET->INIT->RTR->RTS ladder strictly, WRITEs
// copy between this device's own MRs, and every other opcode completes
// successfully without moving data. It counts live objects so tests can
// check that a server cleans up.
type fakeDev struct {
	mu     sync.Mutex
	closed bool
	mrs    map[uint32]*fakeMR
	live   atomic.Int64
	nextK  uint32
}

func newFakeDev() *fakeDev { return &fakeDev{mrs: make(map[uint32]*fakeMR), nextK: 0x1000} }

func (d *fakeDev) Name() string { return "fake" }
func (d *fakeDev) Attr() verbs.DeviceAttr {
	return verbs.DeviceAttr{MaxQP: 64, MaxQPWR: 1 << 16, MaxSGE: 4, MaxCQE: 1 << 16}
}
func (d *fakeDev) Port() verbs.PortAttr {
	d.mu.Lock()
	defer d.mu.Unlock()
	return verbs.PortAttr{Num: 1, Active: !d.closed, MTU: 4096, Addr: "fake:1"}
}

func (d *fakeDev) check() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("fake: device: %w", verbs.ErrClosed)
	}
	return nil
}

func (d *fakeDev) AllocPD() (verbs.PD, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	d.live.Add(1)
	return &fakePD{d: d, c: closer{d: d}}, nil
}

func (d *fakeDev) CreateCQ(n int) (verbs.CQ, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, fmt.Errorf("fake: CQ of %d: %w", n, verbs.ErrInvalid)
	}
	d.live.Add(1)
	return &fakeCQ{d: d, cap: n, ready: make(chan struct{}, 1), c: closer{d: d}}, nil
}

func (d *fakeDev) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("fake: device: %w", verbs.ErrClosed)
	}
	d.closed = true
	return nil
}

// closer makes Close idempotent-with-ErrClosed and keeps the live count.
type closer struct {
	d    *fakeDev
	done atomic.Bool
}

func (c *closer) close(what string) error {
	if c.done.Swap(true) {
		return fmt.Errorf("fake: %s: %w", what, verbs.ErrClosed)
	}
	c.d.live.Add(-1)
	return nil
}

type fakePD struct {
	d    *fakeDev
	refs atomic.Int64
	c    closer
}

func (p *fakePD) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	unpin, err := offheap.Pin(buf)
	if err != nil {
		return nil, fmt.Errorf("fake: register: %w: %w", verbs.ErrInvalid, err)
	}
	p.d.mu.Lock()
	p.d.nextK += 7
	m := &fakeMR{pd: p, buf: buf, key: p.d.nextK, access: access, unpin: unpin, c: closer{d: p.d}}
	p.d.mrs[m.key] = m
	p.d.mu.Unlock()
	p.refs.Add(1)
	p.d.live.Add(1)
	return m, nil
}

func (p *fakePD) CreateQP(init verbs.QPInit) (verbs.QP, error) {
	if init.SendCQ == nil || init.RecvCQ == nil {
		return nil, fmt.Errorf("fake: QP needs CQs: %w", verbs.ErrInvalid)
	}
	scq, ok := init.SendCQ.(*fakeCQ)
	if !ok || scq.d != p.d {
		return nil, fmt.Errorf("fake: foreign CQ %T: %w", init.SendCQ, verbs.ErrInvalid)
	}
	p.refs.Add(1)
	p.d.live.Add(1)
	return &fakeQP{pd: p, cq: scq, num: uint32(p.d.live.Load()) + 100, typ: init.Type, c: closer{d: p.d}}, nil
}

func (p *fakePD) CreateSRQ(init verbs.SRQInit) (verbs.SRQ, error) {
	if init.MaxWR <= 0 {
		return nil, fmt.Errorf("fake: SRQ of %d: %w", init.MaxWR, verbs.ErrInvalid)
	}
	p.refs.Add(1)
	p.d.live.Add(1)
	return &fakeSRQ{pd: p, c: closer{d: p.d}}, nil
}

func (p *fakePD) CreateAH(attr verbs.AHAttr) (verbs.AH, error) {
	p.refs.Add(1)
	p.d.live.Add(1)
	return &fakeAH{pd: p, dest: attr.Dest, c: closer{d: p.d}}, nil
}

func (p *fakePD) Close() error {
	if n := p.refs.Load(); n > 0 {
		return fmt.Errorf("fake: PD has %d objects: %w", n, verbs.ErrBusy)
	}
	return p.c.close("PD")
}

type fakeMR struct {
	pd     *fakePD
	buf    []byte
	key    uint32
	access verbs.Access
	unpin  func()
	c      closer
}

func (m *fakeMR) LKey() uint32         { return m.key }
func (m *fakeMR) RKey() uint32         { return m.key }
func (m *fakeMR) Addr() uint64         { return offheap.Addr(m.buf) }
func (m *fakeMR) Len() int             { return len(m.buf) }
func (m *fakeMR) Bytes() []byte        { return m.buf }
func (m *fakeMR) Access() verbs.Access { return m.access }
func (m *fakeMR) Close() error {
	if err := m.c.close("MR"); err != nil {
		return err
	}
	m.pd.d.mu.Lock()
	delete(m.pd.d.mrs, m.key)
	m.pd.d.mu.Unlock()
	m.unpin()
	m.pd.refs.Add(-1)
	return nil
}

// slice returns the bytes [addr, addr+n) of the MR named key.
func (d *fakeDev) slice(key uint32, addr uint64, n uint32) []byte {
	d.mu.Lock()
	m := d.mrs[key]
	d.mu.Unlock()
	if m == nil || addr < m.Addr() || addr+uint64(n) > m.Addr()+uint64(len(m.buf)) {
		return nil
	}
	off := addr - m.Addr()
	return m.buf[off : off+uint64(n)]
}

type fakeCQ struct {
	d     *fakeDev
	cap   int
	mu    sync.Mutex
	wcs   []verbs.WC
	ready chan struct{} // holds a token while wcs is non-empty
	refs  atomic.Int64
	c     closer
}

func (q *fakeCQ) push(wc verbs.WC) {
	q.mu.Lock()
	q.wcs = append(q.wcs, wc)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

func (q *fakeCQ) Poll(wc []verbs.WC) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.wcs) > q.cap {
		return 0, fmt.Errorf("fake: %w", verbs.ErrCQOverrun)
	}
	n := copy(wc, q.wcs)
	q.wcs = q.wcs[n:]
	return n, nil
}

func (q *fakeCQ) Wait(ctx context.Context) error {
	for {
		q.mu.Lock()
		n := len(q.wcs)
		q.mu.Unlock()
		if n > 0 {
			return nil
		}
		select {
		case <-q.ready:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (q *fakeCQ) Cap() int { return q.cap }
func (q *fakeCQ) Close() error {
	if n := q.refs.Load(); n > 0 {
		return fmt.Errorf("fake: CQ has %d QPs: %w", n, verbs.ErrBusy)
	}
	return q.c.close("CQ")
}

type fakeQP struct {
	pd    *fakePD
	cq    *fakeCQ
	num   uint32
	typ   verbs.QPType
	mu    sync.Mutex
	state verbs.QPState
	c     closer
}

func (q *fakeQP) Num() uint32        { return q.num }
func (q *fakeQP) Type() verbs.QPType { return q.typ }
func (q *fakeQP) State() verbs.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}
func (q *fakeQP) Endpoint() verbs.Endpoint {
	return verbs.Endpoint{Addr: "fake:1", QPN: q.num, PSN: 42}
}

func (q *fakeQP) Modify(attr verbs.QPAttr) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, err := verbs.CheckTransition(q.typ, q.state, attr); err != nil {
		return fmt.Errorf("fake: QP %d: %w", q.num, err)
	}
	q.state = attr.State
	return nil
}

func (q *fakeQP) PostSend(wr []verbs.SendWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := range wr {
		if q.state != verbs.StateRTS {
			return i, fmt.Errorf("fake: post on QP %d in %s: %w", q.num, q.state, verbs.ErrQPState)
		}
		q.cq.push(q.execute(&wr[i]))
	}
	return len(wr), nil
}

// execute runs one WR: a WRITE copies between local MRs, and a bad rkey is
// a remote access error that moves the QP to ERR, like hardware.
func (q *fakeQP) execute(wr *verbs.SendWR) verbs.WC {
	wc := verbs.WC{ID: wr.ID, Op: verbs.CompletionOf(wr.Op), QPN: q.num}
	if wr.Op != verbs.OpWrite {
		return wc
	}
	dst := q.pd.d.slice(wr.RKey, wr.RemoteAddr, uint32(wr.Len()))
	if dst == nil {
		q.state = verbs.StateErr
		wc.Status = verbs.RemAccessErr
		return wc
	}
	for _, s := range wr.SGL {
		src := q.pd.d.slice(s.LKey, s.Addr, s.Length)
		if src == nil {
			wc.Status = verbs.LocProtErr
			return wc
		}
		dst = dst[copy(dst, src):]
	}
	wc.ByteLen = uint32(wr.Len())
	return wc
}

func (q *fakeQP) PostRecv(wr []verbs.RecvWR) (int, error) { return len(wr), nil }
func (q *fakeQP) Close() error {
	if err := q.c.close("QP"); err != nil {
		return err
	}
	q.pd.refs.Add(-1)
	return nil
}

type fakeSRQ struct {
	pd *fakePD
	c  closer
}

func (s *fakeSRQ) PostRecv(wr []verbs.RecvWR) (int, error) { return len(wr), nil }
func (s *fakeSRQ) Close() error {
	if err := s.c.close("SRQ"); err != nil {
		return err
	}
	s.pd.refs.Add(-1)
	return nil
}

type fakeAH struct {
	pd   *fakePD
	dest verbs.Endpoint
	c    closer
}

func (a *fakeAH) Dest() verbs.Endpoint { return a.dest }
func (a *fakeAH) Close() error {
	if err := a.c.close("AH"); err != nil {
		return err
	}
	a.pd.refs.Add(-1)
	return nil
}
