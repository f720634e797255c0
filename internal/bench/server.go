package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/krcore/krcore/internal/bench/control"
	"github.com/krcore/krcore/internal/bench/rawqp"
	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// listenPrefix starts the line a server prints once it accepts clients;
// the demo reads the address from it. metaPrefix starts the line a
// -keep-runtime server prints before it: its MetaServer, for krcored's
// -meta.
const (
	listenPrefix = "krbench server listening on "
	metaPrefix   = "krbench server meta: "
)

// runServer serves clients one at a time until ctx ends (SIGINT), or after
// the first client with -once.
func runServer(ctx context.Context, cfg *config, stdout, stderr io.Writer) (err error) {
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "krbench server: "+format+"\n", a...) }
	fab := cfg.fabricFor(ctx)
	var kept *krServer
	if cfg.keepRuntime {
		if kept, err = keepKrServer(ctx, cfg, fab, slogTo(logfWriter(logf))); err != nil {
			return fmt.Errorf("server: %w", err)
		}
		defer func() { err = firstErr(err, kept.close()) }()
		fmt.Fprintf(stdout, "%s%s\n", metaPrefix, kept.rt.MetaInfo())
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.bind, strconv.Itoa(cfg.port)))
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	fmt.Fprintf(stdout, "%s%s\n", listenPrefix, ln.Addr())
	return serve(ctx, cfg, fab, kept, ln, cfg.once, logf)
}

// serve accepts control connections on ln and runs one session at a time;
// a client arriving while another is served is told the server is busy,
// because two benchmarks sharing two cores would measure each other.
// kept, if not nil, is the KRCore runtime every session offers.
func serve(ctx context.Context, cfg *config, fab fabric, kept *krServer, ln net.Listener, once bool, logf func(string, ...any)) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	defer ln.Close()

	conns := make(chan net.Conn)
	acceptErr := make(chan error, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				acceptErr <- err
				close(conns)
				return
			}
			conns <- c
		}
	}()

	var done chan error // non-nil while a session runs
	var sessionErr error
	for {
		select {
		case c, ok := <-conns:
			if !ok {
				if done != nil {
					sessionErr = <-done
				}
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("server: accept: %w", <-acceptErr)
			}
			if done != nil {
				go refuse(c, cfg.timeout)
				continue
			}
			logf("client %s connected", c.RemoteAddr())
			done = make(chan error, 1)
			go func() { done <- serveSession(ctx, cfg, fab, kept, c, logf) }()
		case sessionErr = <-done:
			done = nil
			if sessionErr != nil {
				logf("session ended: %v", sessionErr)
			} else {
				logf("session ended")
			}
			if once {
				return sessionErr
			}
		}
	}
}

// refuse tells a second client the server is busy.
func refuse(c net.Conn, timeout time.Duration) {
	defer c.Close()
	ctl := control.NewConn(context.Background(), c)
	ctl.Send(&control.Msg{Op: control.OpHello, Err: "server busy with another client; try again later"}, timeout)
}

// session is the server's state for one client.
type session struct {
	ctx  context.Context
	cfg  *config
	fab  fabric
	ctl  *control.Conn
	logf func(string, ...any)

	dev  verbs.Device
	ep   *rawqp.Endpoint // the current test's objects
	conn *rawqp.Endpoint // the connect test's current connection
	cbuf *offheap.Block  // the connect test's MR memory, allocated once

	kr   *krServer // the KRCore runtime, once a client asked for it
	kept *krServer // the runtime kept across sessions (-keep-runtime), not the session's to close

	rawLn   net.Listener
	rawWG   sync.WaitGroup
	rawMu   sync.Mutex
	rawConn net.Conn
}

// serveSession answers one client's requests until it says bye, goes away,
// or ctx ends.
func serveSession(ctx context.Context, cfg *config, fab fabric, kept *krServer, conn net.Conn, logf func(string, ...any)) (err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := &session{ctx: ctx, cfg: cfg, fab: fab, ctl: control.NewConn(ctx, conn), logf: logf, kr: kept, kept: kept}
	defer func() {
		if cerr := s.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	for {
		m, err := s.ctl.Recv(cfg.idle)
		if err != nil {
			if ctx.Err() != nil {
				return nil // shutting down
			}
			return err
		}
		reply, herr := s.handle(m)
		if herr != nil {
			logf("%s: %v", m.Op, herr)
			reply = &control.Msg{Op: m.Op, Err: herr.Error()}
		}
		if err := s.ctl.Send(reply, cfg.timeout); err != nil {
			return err
		}
		if m.Op == control.OpBye {
			return nil
		}
	}
}

// Limits on what a client may ask of the server: it allocates memory and
// queues on the client's say-so.
const (
	maxDepth = 8192
)

func (s *session) handle(m *control.Msg) (*control.Msg, error) {
	if m.Op != control.OpHello && m.Op != control.OpBye && s.dev == nil {
		return nil, fmt.Errorf("%s before hello", m.Op)
	}
	switch m.Op {
	case control.OpHello:
		if m.Version != control.Version {
			return nil, fmt.Errorf("client speaks control protocol %d, server %d: use the same krbench on both sides", m.Version, control.Version)
		}
		if m.Fabric != s.fab.placement() {
			return nil, fmt.Errorf("client wants a %s fabric, this server runs %s", m.Fabric, s.fab.placement())
		}
		if s.dev == nil {
			dev, err := s.fab.newNode("server")
			if err != nil {
				return nil, err
			}
			s.dev = dev
		}
		return &control.Msg{Op: control.OpHello, Version: control.Version, Node: s.fab.describe(s.dev), Fabric: s.fab.placement()}, nil

	case control.OpSetup:
		if err := s.closeEP(); err != nil {
			return nil, err
		}
		if m.MaxSize < 1 || m.MaxSize > maxSize || m.TxDepth < 1 || m.TxDepth > maxDepth || m.RxDepth < 0 || m.RxDepth > maxDepth {
			return nil, fmt.Errorf("setup: size %d (max %d) or depths %d/%d (max %d) out of range", m.MaxSize, maxSize, m.TxDepth, m.RxDepth, maxDepth)
		}
		remote, err := control.UnmarshalEP(m.EP)
		if err != nil {
			return nil, err
		}
		// The server sends only in the SEND tests (echoes), and receives
		// only there; its QP is otherwise a pure responder.
		sh := rawqp.Shape{SendDepth: m.TxDepth, RecvDepth: 1, Inline: m.Inline, Shared: m.Shared}
		if m.Test == testSend {
			sh.RecvDepth = m.RxDepth
		}
		ep, err := rawqp.NewEndpoint(s.dev, nil, m.MaxSize, sh)
		if err != nil {
			return nil, err
		}
		s.ep = ep
		if err := ep.Connect(remote); err != nil {
			return nil, err
		}
		if m.Test == testSend {
			// Before replying: the client may SEND as soon as it has our
			// endpoint, and an RC SEND needs a posted receive. (A QP takes
			// receives from INIT on; Connect has passed it.)
			if err := ep.PostRecvs(m.RxDepth); err != nil {
				return nil, err
			}
		}
		b, err := control.MarshalEP(ep.QP)
		if err != nil {
			return nil, err
		}
		return &control.Msg{Op: control.OpSetup, EP: b, MR: ep.Remote()}, nil

	case control.OpRun:
		if m.Test == runVQEcho {
			return s.vqEcho(m)
		}
		if s.ep == nil {
			return nil, errors.New("run before setup")
		}
		if m.Size < 1 || m.Size > s.ep.MR.Len() || m.Total < 1 {
			return nil, fmt.Errorf("run: size %d (MR %d B) or count %d out of range", m.Size, s.ep.MR.Len(), m.Total)
		}
		ctx, stop := s.ctl.Watch(s.ctx)
		defer stop()
		p := rawqp.NewPoller(ctx, s.ep.CQ, s.cfg.spinFor(s.fab.placement()), s.cfg.timeout, s.fab.placement() == placementInproc)
		defer p.Close()
		var err error
		switch {
		case m.Test == testSend && m.Mode == modeLat:
			err = s.ep.Echo(p, m.Size, m.Total)
		case m.Test == testSend && m.Mode == modeBW:
			err = s.ep.Sink(p, m.Total)
		default:
			err = fmt.Errorf("run: the server takes no part in %s %s", m.Test, m.Mode)
		}
		if err != nil {
			return nil, err
		}
		return &control.Msg{Op: control.OpRun}, nil

	case control.OpTeardown:
		return &control.Msg{Op: control.OpTeardown}, s.closeEP()

	case control.OpConnCreate:
		return s.connCreate(m)

	case control.OpKrStart:
		if s.kr == nil {
			kr, err := startKrServer(s.ctx, s.dev, slogTo(logfWriter(s.logf)), s.cfg.timeout, newVQPoll(s.cfg, s.fab.placement()))
			if err != nil {
				return nil, err
			}
			s.kr = kr
		}
		return &control.Msg{Op: control.OpKrStart, Meta: s.kr.rt.MetaInfo().String(), NodeID: serverNode, Client: uint64(s.kr.clientNode())}, nil

	case control.OpConnClose:
		err := s.closeConn()
		return &control.Msg{Op: control.OpConnClose}, err

	case control.OpRaw:
		return s.rawOpen()

	case control.OpRawDone:
		return &control.Msg{Op: control.OpRawDone}, s.rawClose()

	case control.OpBye:
		return &control.Msg{Op: control.OpBye}, nil
	}
	return nil, fmt.Errorf("unknown request %q", m.Op)
}

// vqEcho plays the server's part in a VQ ping-pong: echo m.Total messages
// arriving at echoPort.
func (s *session) vqEcho(m *control.Msg) (*control.Msg, error) {
	if s.kr == nil {
		return nil, errors.New("run: VQ echo before kr-start")
	}
	if m.Total < 1 || m.Total > 1<<30 {
		return nil, fmt.Errorf("run: VQ echo of %d messages out of range", m.Total)
	}
	ctx, stop := s.ctl.Watch(s.ctx)
	defer stop()
	if err := s.kr.echo.Serve(ctx, m.Total, s.cfg.timeout); err != nil {
		return nil, err
	}
	return &control.Msg{Op: control.OpRun}, nil
}

// connSize is the connect test's MR: enough for the proving READ.
const connSize = 4096

// connCreate is the server's part of one timed connection: create PD, CQ,
// QP and MR, connect the QP to the client's, and say how long each took so
// the client can split the round trip into phases.
func (s *session) connCreate(m *control.Msg) (*control.Msg, error) {
	if err := s.closeConn(); err != nil {
		return nil, err
	}
	remote, err := control.UnmarshalEP(m.EP)
	if err != nil {
		return nil, err
	}
	if s.cbuf == nil {
		if s.cbuf, err = rawqp.AllocBuf(connSize); err != nil {
			return nil, err
		}
	}
	// The value the client's first READ must find: it proves the READ
	// reached this connection's MR, not stale memory.
	binary.LittleEndian.PutUint64(s.cbuf.Bytes(), m.Token)

	t0 := time.Now()
	ep, err := rawqp.NewEndpoint(s.dev, s.cbuf, connSize, rawqp.Shape{SendDepth: 4, RecvDepth: 1})
	if err != nil {
		return nil, err
	}
	t1 := time.Now()
	s.conn = ep
	if err := ep.Connect(remote); err != nil {
		return nil, err
	}
	t2 := time.Now()
	b, err := control.MarshalEP(ep.QP)
	if err != nil {
		return nil, err
	}
	return &control.Msg{Op: control.OpConnCreate, EP: b, MR: ep.Remote(), CreateNS: int64(t1.Sub(t0)), ModifyNS: int64(t2.Sub(t1))}, nil
}

func (s *session) closeEP() error {
	if s.ep == nil {
		return nil
	}
	err := s.ep.Close()
	s.ep = nil
	return err
}

func (s *session) closeConn() error {
	if s.conn == nil {
		return nil
	}
	err := s.conn.Close()
	s.conn = nil
	return err
}

// close releases everything the session made.
func (s *session) close() error {
	errs := []error{s.rawClose(), s.closeEP(), s.closeConn()}
	if s.kr != nil && s.kr != s.kept {
		errs = append(errs, s.kr.close())
	}
	if s.cbuf != nil {
		errs = append(errs, s.cbuf.Close())
	}
	if s.dev != nil {
		errs = append(errs, s.dev.Close())
	}
	s.ctl.Close()
	return errors.Join(errs...)
}
