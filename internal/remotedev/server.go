package remotedev

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/krcore/krcore/verbs"
)

// DefaultMaxInflight bounds the requests one connection has in progress.
const DefaultMaxInflight = 256

// maxWaitSlice caps a client's requested CQ wait, so a misbehaving client
// cannot pin a server goroutine for long.
const maxWaitSlice = 5 * time.Second

// Server serves one device to each connection given to Serve.
type Server struct {
	// Device is the device served.
	Device verbs.Device
	// Control, if set, handles Client.Control requests: hooks outside the
	// verbs API, such as a test breaking a link. Nil refuses them with
	// verbs.ErrUnsupported.
	Control func(ctx context.Context, name string, arg []byte) ([]byte, error)
	// MaxInflight bounds the requests of one connection handled at once;
	// default DefaultMaxInflight. Reading stops while it is reached.
	MaxInflight int
}

// Serve serves dev over conn until the client closes it, ctx ends, or the
// stream fails. See Server.Serve.
func Serve(ctx context.Context, conn io.ReadWriteCloser, dev verbs.Device) error {
	return (&Server{Device: dev}).Serve(ctx, conn)
}

// Serve serves srv.Device over conn, each request in its own goroutine.
// When it returns, conn is closed and every object the client made and did
// not close has been closed; the device itself is closed only if the client
// closed it. It returns nil when the client hung up, ctx.Err() when ctx
// ended, and the stream's error otherwise.
func (srv *Server) Serve(ctx context.Context, conn io.ReadWriteCloser) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := newStream(conn)
	stop := context.AfterFunc(ctx, func() { s.shut(ctx.Err()) })
	defer stop()
	ss := &session{srv: srv, s: s, ctx: ctx, objs: handles{objs: make(map[uint64]*object)}}

	limit := srv.MaxInflight
	if limit <= 0 {
		limit = DefaultMaxInflight
	}
	sem := make(chan struct{}, limit)
	var wg sync.WaitGroup
	ss.readLoop(sem, &wg)
	cancel() // ends handlers blocked in CQ waits
	wg.Wait()
	s.close()
	ss.cleanup()
	return serveResult(s.cause)
}

func serveResult(cause error) error {
	switch {
	case errors.Is(cause, io.EOF), errors.Is(cause, errLocalClose):
		return nil
	case errors.Is(cause, context.Canceled), errors.Is(cause, context.DeadlineExceeded):
		return cause
	}
	return fmt.Errorf("remote: serve: %w", cause)
}

// session is one connection's state.
type session struct {
	srv  *Server
	s    *stream
	ctx  context.Context // ends with the connection
	objs handles
	mem  memCache
}

// readLoop reads requests until the stream ends, handing each to a
// goroutine that wg tracks.
func (ss *session) readLoop(sem chan struct{}, wg *sync.WaitGroup) {
	for {
		req := new(request)
		if ss.s.recv(req) != nil {
			return
		}
		select {
		case sem <- struct{}{}:
		case <-ss.s.done:
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ss.reply(req)
		}()
	}
}

// reply runs one request and sends its response.
func (ss *session) reply(req *request) {
	resp, err := ss.handle(req)
	if resp == nil {
		resp = new(response)
	}
	resp.Seq = req.Seq
	resp.Err = encodeError(err)
	if err := ss.s.send(ss.ctx, resp); errors.Is(err, verbs.ErrInvalid) {
		// The answer could not be encoded: say so instead.
		ss.s.send(ss.ctx, &response{Seq: req.Seq, Err: encodeError(err)})
	}
}

// handle dispatches one request.
func (ss *session) handle(req *request) (*response, error) {
	dev := ss.srv.Device
	switch req.Op {
	case opHello:
		return ss.hello(req)
	case opPort:
		p := dev.Port()
		return &response{Port: &p}, nil
	case opCloseDevice:
		return nil, ss.closeDevice()
	case opAllocPD:
		return created(ss.objs.add(dev.AllocPD()))
	case opCreateCQ:
		return ss.createCQ(req)
	case opClose:
		return nil, ss.objs.close(req.H)
	case opControl:
		return ss.control(req)
	}
	return ss.handleObject(req)
}

// handleObject dispatches calls on PDs, CQs, QPs and SRQs.
func (ss *session) handleObject(req *request) (*response, error) {
	switch req.Op {
	case opRegMR:
		return ss.regMR(req)
	case opCreateQP:
		return ss.createQP(req)
	case opCreateSRQ:
		return ss.createSRQ(req)
	case opCreateAH:
		return ss.createAH(req)
	case opPoll:
		return ss.poll(req)
	case opWait:
		return ss.wait(req)
	case opQPState, opQPEndpoint, opModify, opPostSend, opPostRecv:
		return ss.qpCall(req)
	case opSRQPostRecv:
		return ss.srqPostRecv(req)
	}
	return nil, fmt.Errorf("remote: unknown call %s: %w", req.Op, verbs.ErrUnsupported)
}

func (ss *session) hello(req *request) (*response, error) {
	if req.Version != protocolVersion {
		return nil, fmt.Errorf("remote: client protocol %d, server %d: %w", req.Version, protocolVersion, verbs.ErrUnsupported)
	}
	dev := ss.srv.Device
	return &response{Hello: &hello{Version: protocolVersion, Name: dev.Name(), Attr: dev.Attr(), PID: os.Getpid()}}, nil
}

// closeDevice closes the device, then the client's objects, so that
// registrations release their mappings of client memory.
func (ss *session) closeDevice() error {
	err := ss.srv.Device.Close()
	ss.objs.closeAll()
	return err
}

// cleanup closes what the client left open when the connection ends.
func (ss *session) cleanup() { ss.objs.closeAll() }

func (ss *session) control(req *request) (*response, error) {
	if ss.srv.Control == nil {
		return nil, fmt.Errorf("remote: control %q: no control hook: %w", req.Name, verbs.ErrUnsupported)
	}
	data, err := ss.srv.Control(ss.ctx, req.Name, req.Data)
	return &response{Data: data}, err
}

// created answers a creation with the new handle.
func created(h uint64, err error) (*response, error) {
	if err != nil {
		return nil, err
	}
	return &response{H: h}, nil
}

func (ss *session) createCQ(req *request) (*response, error) {
	q, err := ss.srv.Device.CreateCQ(req.N)
	h, err := ss.objs.add(q, err)
	if err != nil {
		return nil, err
	}
	return &response{H: h, N: q.Cap()}, nil
}

func (ss *session) regMR(req *request) (*response, error) {
	p, err := get[verbs.PD](&ss.objs, req.H)
	if err != nil {
		return nil, err
	}
	if req.Mem == nil {
		return nil, fmt.Errorf("remote: register without memory: %w", verbs.ErrInvalid)
	}
	buf, release, err := ss.mem.acquire(req.Mem)
	if err != nil {
		return nil, err
	}
	m, err := p.RegMR(buf, req.Access)
	if err != nil {
		release()
		return nil, err
	}
	h, err := ss.objs.addWith(m, orderMR, release)
	if err != nil {
		return nil, err
	}
	return &response{H: h, MR: &mrInfo{LKey: m.LKey(), RKey: m.RKey(), Addr: m.Addr(), Len: m.Len(), Access: m.Access()}}, nil
}

func (ss *session) createQP(req *request) (*response, error) {
	p, err := get[verbs.PD](&ss.objs, req.H)
	if err != nil {
		return nil, err
	}
	if req.QPInit == nil {
		return nil, fmt.Errorf("remote: create QP without attributes: %w", verbs.ErrInvalid)
	}
	init, err := ss.qpInit(req.QPInit)
	if err != nil {
		return nil, err
	}
	q, err := p.CreateQP(init)
	h, err := ss.objs.add(q, err)
	if err != nil {
		return nil, err
	}
	return &response{H: h, QP: &qpInfo{Num: q.Num(), Type: q.Type()}}, nil
}

// qpInit resolves handles; 0 stays nil for the provider to judge.
func (ss *session) qpInit(w *qpInit) (verbs.QPInit, error) {
	init := verbs.QPInit{Type: w.Type, Cap: w.Cap, SignalAll: w.SignalAll, DCKey: w.DCKey}
	var err error
	if w.SendCQ != 0 {
		if init.SendCQ, err = get[verbs.CQ](&ss.objs, w.SendCQ); err != nil {
			return init, err
		}
	}
	if w.RecvCQ != 0 {
		if init.RecvCQ, err = get[verbs.CQ](&ss.objs, w.RecvCQ); err != nil {
			return init, err
		}
	}
	if w.SRQ != 0 {
		if init.SRQ, err = get[verbs.SRQ](&ss.objs, w.SRQ); err != nil {
			return init, err
		}
	}
	return init, nil
}

func (ss *session) createSRQ(req *request) (*response, error) {
	p, err := get[verbs.PD](&ss.objs, req.H)
	if err != nil {
		return nil, err
	}
	if req.SRQInit == nil {
		return nil, fmt.Errorf("remote: create SRQ without attributes: %w", verbs.ErrInvalid)
	}
	return created(ss.objs.add(p.CreateSRQ(*req.SRQInit)))
}

func (ss *session) createAH(req *request) (*response, error) {
	p, err := get[verbs.PD](&ss.objs, req.H)
	if err != nil {
		return nil, err
	}
	if req.AHAttr == nil {
		return nil, fmt.Errorf("remote: create AH without attributes: %w", verbs.ErrInvalid)
	}
	a, err := p.CreateAH(*req.AHAttr)
	h, err := ss.objs.add(a, err)
	if err != nil {
		return nil, err
	}
	dest := a.Dest()
	return &response{H: h, Dest: &dest}, nil
}

func (ss *session) poll(req *request) (*response, error) {
	q, err := get[verbs.CQ](&ss.objs, req.H)
	if err != nil {
		return nil, err
	}
	wc := make([]verbs.WC, min(max(req.N, 0), maxPoll))
	n, err := q.Poll(wc)
	return &response{WC: wc[:n]}, err
}

// wait blocks for at most the slice the client asked for; running out is
// an answer (Ready false), not an error, so the client tells it apart from
// its own context ending.
func (ss *session) wait(req *request) (*response, error) {
	q, err := get[verbs.CQ](&ss.objs, req.H)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ss.ctx, min(max(req.Timeout, time.Millisecond), maxWaitSlice))
	defer cancel()
	err = q.Wait(ctx)
	if err != nil && ctx.Err() != nil && ss.ctx.Err() == nil {
		return &response{Ready: false}, nil
	}
	return &response{Ready: err == nil}, err
}

func (ss *session) qpCall(req *request) (*response, error) {
	q, err := get[verbs.QP](&ss.objs, req.H)
	if err != nil {
		return nil, err
	}
	switch req.Op {
	case opQPState:
		return &response{State: q.State()}, nil
	case opQPEndpoint:
		ep := q.Endpoint()
		return &response{Endpoint: &ep}, nil
	case opModify:
		if req.QPAttr == nil {
			return nil, fmt.Errorf("remote: modify QP without attributes: %w", verbs.ErrInvalid)
		}
		return nil, q.Modify(*req.QPAttr)
	case opPostSend:
		return ss.postSend(q, req.Send)
	}
	n, err := q.PostRecv(req.Recv)
	return &response{N: n}, err
}

// postSend resolves each request's AH. A bad handle refuses that request
// after posting the ones before it, as a provider refuses a bad WR.
func (ss *session) postSend(q verbs.QP, ws []sendWR) (*response, error) {
	wr := make([]verbs.SendWR, 0, len(ws))
	var bad error
	for i := range ws {
		var a verbs.AH
		if ws[i].AH != 0 {
			if a, bad = get[verbs.AH](&ss.objs, ws[i].AH); bad != nil {
				break
			}
		}
		wr = append(wr, ws[i].verbs(a))
	}
	if bad != nil && len(wr) == 0 {
		return &response{}, bad
	}
	n, err := q.PostSend(wr)
	if err == nil {
		err = bad
	}
	return &response{N: n}, err
}

func (ss *session) srqPostRecv(req *request) (*response, error) {
	q, err := get[verbs.SRQ](&ss.objs, req.H)
	if err != nil {
		return nil, err
	}
	n, err := q.PostRecv(req.Recv)
	return &response{N: n}, err
}
