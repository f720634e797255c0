package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/krcore/krcore/internal/bench/control"
	"github.com/krcore/krcore/internal/perf"
)

// The raw baseline is plain Go TCP between the same two processes, on its
// own connection: what the soft fabric's TCP link would cost with no RDMA
// semantics on top. A phase starts with a 16-byte header from the client:
// kind (4 bytes), message size (4), count (8), big-endian.
const (
	rawPingPong = 1 // the server echoes count messages of size bytes
	rawStream   = 2 // the server reads count*size bytes, then sends 1 byte
	rawHdrLen   = 16
)

// rawRefresh is how many messages pass between deadline refreshes: setting
// a deadline arms a timer, too dear to do for every 8-byte message.
const rawRefresh = 256

// rawOpen starts a listener for the baseline connection and serves it in the
// background; the control connection stays free for rawClose.
func (s *session) rawOpen() (*control.Msg, error) {
	if err := s.rawClose(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(s.cfg.bind, "0"))
	if err != nil {
		return nil, fmt.Errorf("raw: %w", err)
	}
	s.rawLn = ln
	s.rawWG.Add(1)
	go func() {
		defer s.rawWG.Done()
		if err := s.rawServe(ln); err != nil {
			s.logf("raw baseline: %v", err)
		}
	}()
	return &control.Msg{Op: control.OpRaw, Port: ln.Addr().(*net.TCPAddr).Port}, nil
}

// rawServe accepts one connection and answers its phases until EOF.
func (s *session) rawServe(ln net.Listener) error {
	if tl, ok := ln.(*net.TCPListener); ok {
		tl.SetDeadline(time.Now().Add(s.cfg.timeout))
	}
	c, err := ln.Accept()
	ln.Close() // one connection per baseline
	if err != nil {
		return fmt.Errorf("accept: %w", err)
	}
	s.rawMu.Lock()
	s.rawConn = c
	s.rawMu.Unlock()
	defer c.Close()
	var hdr [rawHdrLen]byte
	var buf []byte
	for {
		c.SetDeadline(time.Now().Add(s.cfg.idle))
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("read phase header: %w", err)
		}
		kind := binary.BigEndian.Uint32(hdr[0:])
		size := int(binary.BigEndian.Uint32(hdr[4:]))
		count := binary.BigEndian.Uint64(hdr[8:])
		if size < 1 || size > maxSize || count < 1 || count > 1<<32 {
			return fmt.Errorf("phase of %d x %d B out of range", count, size)
		}
		if len(buf) < size {
			buf = make([]byte, size)
		}
		switch kind {
		case rawPingPong:
			for i := range count {
				if i%rawRefresh == 0 {
					c.SetDeadline(time.Now().Add(s.cfg.timeout))
				}
				if _, err := io.ReadFull(c, buf[:size]); err != nil {
					return fmt.Errorf("ping-pong read #%d: %w", i, err)
				}
				if _, err := c.Write(buf[:size]); err != nil {
					return fmt.Errorf("ping-pong write #%d: %w", i, err)
				}
			}
		case rawStream:
			left := count * uint64(size)
			for left > 0 {
				c.SetDeadline(time.Now().Add(s.cfg.timeout))
				n, err := c.Read(buf[:min(uint64(len(buf)), left)])
				if err != nil {
					return fmt.Errorf("stream read with %d B left: %w", left, err)
				}
				left -= uint64(n)
			}
			if _, err := c.Write(buf[:1]); err != nil {
				return fmt.Errorf("stream ack: %w", err)
			}
		default:
			return fmt.Errorf("unknown phase kind %d", kind)
		}
	}
}

// rawClose stops the baseline listener and connection and waits for the
// goroutine serving them.
func (s *session) rawClose() error {
	if s.rawLn == nil {
		return nil
	}
	s.rawLn.Close()
	s.rawMu.Lock()
	if s.rawConn != nil {
		s.rawConn.Close()
	}
	s.rawConn = nil
	s.rawMu.Unlock()
	s.rawWG.Wait()
	s.rawLn = nil
	return nil
}

// rawClient is the client end of the baseline connection.
type rawClient struct {
	c       net.Conn
	timeout time.Duration
	buf     []byte
}

func (r *rawClient) phase(kind, size int, count uint64) error {
	var hdr [rawHdrLen]byte
	binary.BigEndian.PutUint32(hdr[0:], uint32(kind))
	binary.BigEndian.PutUint32(hdr[4:], uint32(size))
	binary.BigEndian.PutUint64(hdr[8:], count)
	r.c.SetDeadline(time.Now().Add(r.timeout))
	if _, err := r.c.Write(hdr[:]); err != nil {
		return fmt.Errorf("tcp baseline: start phase: %w", err)
	}
	if len(r.buf) < size {
		r.buf = make([]byte, size)
	}
	return nil
}

// pingPong measures warmup+iters round trips of size bytes and returns the
// last iters.
func (r *rawClient) pingPong(size, warmup, iters int) ([]time.Duration, error) {
	if err := r.phase(rawPingPong, size, uint64(warmup+iters)); err != nil {
		return nil, err
	}
	b := r.buf[:size]
	samples := make([]time.Duration, 0, iters)
	for i := range warmup + iters {
		if i%rawRefresh == 0 {
			r.c.SetDeadline(time.Now().Add(r.timeout))
		}
		t0 := time.Now()
		if _, err := r.c.Write(b); err != nil {
			return nil, fmt.Errorf("tcp ping-pong %d B #%d: %w", size, i, err)
		}
		if _, err := io.ReadFull(r.c, b); err != nil {
			return nil, fmt.Errorf("tcp ping-pong %d B #%d: %w", size, i, err)
		}
		if d := time.Since(t0); i >= warmup {
			samples = append(samples, d)
		}
	}
	return samples, nil
}

// stream writes count messages of size bytes and waits for the server's
// acknowledgement that it read them all: the bandwidth a Go program gets
// from one TCP connection. Marks come from the sender's side (a write
// returns once the kernel has the bytes) every markEvery messages; the last
// one is the acknowledgement, so the average is end to end.
func (r *rawClient) stream(size, count, markEvery int) ([]perf.Mark, error) {
	if err := r.phase(rawStream, size, uint64(count)); err != nil {
		return nil, err
	}
	b := r.buf[:size]
	marks := make([]perf.Mark, 1, count/markEvery+2)
	start := time.Now()
	for i := range count {
		if i%rawRefresh == 0 {
			r.c.SetDeadline(time.Now().Add(r.timeout))
		}
		if _, err := r.c.Write(b); err != nil {
			return nil, fmt.Errorf("tcp stream %d B #%d: %w", size, i, err)
		}
		if (i+1)%markEvery == 0 && i+1 < count {
			marks = append(marks, perf.Mark{At: time.Since(start), Msgs: i + 1})
		}
	}
	r.c.SetDeadline(time.Now().Add(r.timeout))
	if _, err := io.ReadFull(r.c, b[:1]); err != nil {
		return nil, fmt.Errorf("tcp stream %d B: wait for the server's ack: %w", size, err)
	}
	return append(marks, perf.Mark{At: time.Since(start), Msgs: count}), nil
}

// openRaw has the server open its baseline listener and connects to it.
// done closes the connection and tells the server.
func (c *client) openRaw() (rc *rawClient, done func() error, err error) {
	cfg := c.cfg
	rep, err := c.ctl.Call(&control.Msg{Op: control.OpRaw}, cfg.timeout)
	if err != nil {
		return nil, nil, fmt.Errorf("tcp baseline: %w", err)
	}
	d := net.Dialer{Timeout: cfg.timeout}
	conn, err := d.DialContext(c.ctx, "tcp", net.JoinHostPort(c.host, strconv.Itoa(rep.Port)))
	if err != nil {
		c.ctl.Call(&control.Msg{Op: control.OpRawDone}, cfg.timeout)
		return nil, nil, fmt.Errorf("tcp baseline: connect: %w", err)
	}
	done = func() error {
		conn.Close()
		if _, err := c.ctl.Call(&control.Msg{Op: control.OpRawDone}, cfg.timeout); err != nil {
			return fmt.Errorf("tcp baseline: %w", err)
		}
		return nil
	}
	return &rawClient{c: conn, timeout: cfg.timeout}, done, nil
}

// runRaw measures the plain TCP baseline at the sizes the RDMA tests use.
func (c *client) runRaw() (err error) {
	cfg := c.cfg
	rc, done, err := c.openRaw()
	if err != nil {
		return err
	}
	defer func() { err = firstErr(err, done()) }()
	conn := rc.c
	info := []perf.Field{
		{Key: "Transport", Value: "Go net.TCPConn, TCP_NODELAY"},
		{Key: "Path", Value: conn.LocalAddr().String() + " <-> " + conn.RemoteAddr().String()},
	}
	for _, mode := range cfg.modesOf(testRaw) {
		res := perf.Result{Title: titles[testRaw+mode], Test: testRaw, Mode: perf.Mode(mode), Placement: c.place, Info: info}
		// The sizes the RDMA tests of this mode use (not atomics' 8 B
		// alone, unless nothing else runs).
		sizes := cfg.sizes(testRead, mode)
		if mode == modeLat {
			res.Info = append(slices.Clip(info), perf.Field{Key: "Latency", Value: "full round trip: write, then read the echo"})
			for _, size := range sizes {
				iters, warmup := cfg.iters(mode, size)
				c.logf("tcp ping-pong: %d B x %d", size, iters)
				s, err := rc.pingPong(size, warmup, iters)
				if err != nil {
					return err
				}
				res.Latency = append(res.Latency, perf.Latency(size, s))
			}
		} else {
			res.Info = append(slices.Clip(info), perf.Field{Key: "BW", Value: "average: until the receiver acknowledges the last byte; peak: from the sender's writes (kernel buffering flatters it)"})
			for _, size := range sizes {
				iters, warmup := cfg.iters(mode, size)
				c.logf("tcp stream: %d B x %d", size, iters)
				if _, err := rc.stream(size, warmup, cfg.cqMod); err != nil {
					return err
				}
				marks, err := rc.stream(size, iters, cfg.cqMod)
				if err != nil {
					return err
				}
				res.Bandwidth = append(res.Bandwidth, perf.Bandwidth(size, marks, cfg.txDepth))
			}
		}
		if err := c.out.Add(res); err != nil {
			return err
		}
	}
	return nil
}
