package bench

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/krcore/krcore/verbs"
)

// rcMesh is the raw verbs side: per node a PD and a CQ, per pair a TCP
// connection, all made beforehand; the higher node of each pair runs an
// agent that answers endpoint requests.
type rcMesh struct {
	devs    []verbs.Device
	pds     []verbs.PD
	cqs     []verbs.CQ
	timeout time.Duration
	links   [][]*meshLink // links[i]: node i's active ends, to nodes j > i
	passive []net.Conn
	wg      sync.WaitGroup // agents

	mu  sync.Mutex
	qps []verbs.QP // the current mesh's QPs, both ends
}

// meshLink is the active end of one pair's exchange connection.
type meshLink struct {
	peer int
	conn net.Conn
	r    *bufio.Reader
	qp   verbs.QP
}

func newRCMesh(devs []verbs.Device, timeout time.Duration) (_ *rcMesh, err error) {
	n := len(devs)
	m := &rcMesh{devs: devs, timeout: timeout, links: make([][]*meshLink, n)}
	defer func() {
		if err != nil {
			m.close()
		}
	}()
	for _, d := range devs {
		pd, err := d.AllocPD()
		if err != nil {
			return nil, fmt.Errorf("mesh: alloc PD: %w", err)
		}
		m.pds = append(m.pds, pd)
		cq, err := d.CreateCQ(2*n*meshQPDepth + 16)
		if err != nil {
			return nil, fmt.Errorf("mesh: create CQ: %w", err)
		}
		m.cqs = append(m.cqs, cq)
	}
	for j := 1; j < n; j++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("mesh: listen: %w", err)
		}
		ln.(*net.TCPListener).SetDeadline(time.Now().Add(timeout))
		for i := 0; i < j; i++ {
			d := net.Dialer{Timeout: timeout}
			a, err := d.Dial("tcp", ln.Addr().String())
			if err != nil {
				ln.Close()
				return nil, fmt.Errorf("mesh: dial: %w", err)
			}
			b, err := ln.Accept()
			if err != nil {
				a.Close()
				ln.Close()
				return nil, fmt.Errorf("mesh: accept: %w", err)
			}
			m.links[i] = append(m.links[i], &meshLink{peer: j, conn: a, r: bufio.NewReader(a)})
			m.passive = append(m.passive, b)
			m.wg.Add(1)
			go func() {
				defer m.wg.Done()
				m.agent(j, b)
			}()
		}
		ln.Close()
	}
	return m, nil
}

// agent is node j's side of one pair: for each request (the asker's
// endpoint) it creates an RC QP, connects it and answers with its own
// endpoint. It ends when the connection closes.
func (m *rcMesh) agent(j int, conn net.Conn) {
	r := bufio.NewReader(conn)
	for {
		conn.SetDeadline(time.Now().Add(m.timeout + time.Minute))
		b, err := readFrame(r)
		if err != nil {
			return // closed by close(), or the asker failed
		}
		reply, err := m.accept(j, b)
		if err != nil {
			reply = append([]byte{1}, err.Error()...)
		}
		if writeFrame(conn, reply) != nil {
			return
		}
	}
}

func (m *rcMesh) accept(j int, b []byte) ([]byte, error) {
	var remote verbs.Endpoint
	if err := remote.UnmarshalBinary(b); err != nil {
		return nil, err
	}
	qp, err := m.newQP(j)
	if err != nil {
		return nil, err
	}
	if err := verbs.Connect(qp, remote, verbs.Path{}); err != nil {
		return nil, err
	}
	ep, err := qp.Endpoint().MarshalBinary()
	if err != nil {
		return nil, err
	}
	return append([]byte{0}, ep...), nil
}

func (m *rcMesh) newQP(i int) (verbs.QP, error) {
	qp, err := m.pds[i].CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: m.cqs[i], RecvCQ: m.cqs[i],
		Cap: verbs.QPCap{MaxSendWR: meshQPDepth, MaxRecvWR: meshQPDepth, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return nil, fmt.Errorf("create RC QP on node %d: %w", i+1, err)
	}
	m.mu.Lock()
	m.qps = append(m.qps, qp)
	m.mu.Unlock()
	return qp, nil
}

// create connects every pair and returns the wall time. Each node's
// goroutine creates its QPs and sends every request first, then reads the
// answers and connects, so the pairs' exchanges overlap.
func (m *rcMesh) create(ctx context.Context) (time.Duration, error) {
	n := len(m.devs)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	dl, _ := ctx.Deadline()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = m.ask(i, dl)
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	return time.Since(t0), errors.Join(errs...)
}

// ask is node i's active part of a mesh.
func (m *rcMesh) ask(i int, deadline time.Time) error {
	for _, l := range m.links[i] {
		qp, err := m.newQP(i)
		if err != nil {
			return err
		}
		l.qp = qp
		ep, err := qp.Endpoint().MarshalBinary()
		if err != nil {
			return err
		}
		l.conn.SetDeadline(deadline)
		if err := writeFrame(l.conn, ep); err != nil {
			return fmt.Errorf("node %d asks node %d: %w", i+1, l.peer+1, err)
		}
	}
	for _, l := range m.links[i] {
		b, err := readFrame(l.r)
		if err != nil {
			return fmt.Errorf("node %d waits for node %d: %w", i+1, l.peer+1, err)
		}
		if len(b) == 0 || b[0] != 0 {
			return fmt.Errorf("node %d refused node %d: %s", l.peer+1, i+1, b[min(len(b), 1):])
		}
		var remote verbs.Endpoint
		if err := remote.UnmarshalBinary(b[1:]); err != nil {
			return err
		}
		if err := verbs.Connect(l.qp, remote, verbs.Path{}); err != nil {
			return fmt.Errorf("node %d connects to node %d: %w", i+1, l.peer+1, err)
		}
	}
	return nil
}

// reset destroys the mesh's QPs.
func (m *rcMesh) reset() error {
	m.mu.Lock()
	qps := m.qps
	m.qps = nil
	m.mu.Unlock()
	var errs []error
	for _, qp := range qps {
		errs = append(errs, qp.Close())
	}
	for _, ls := range m.links {
		for _, l := range ls {
			l.qp = nil
		}
	}
	return errors.Join(errs...)
}

// close ends the agents and releases everything.
func (m *rcMesh) close() error {
	for _, ls := range m.links {
		for _, l := range ls {
			l.conn.Close()
		}
	}
	for _, c := range m.passive {
		c.Close()
	}
	m.wg.Wait()
	errs := []error{m.reset()}
	for _, cq := range m.cqs {
		errs = append(errs, cq.Close())
	}
	for _, pd := range m.pds {
		errs = append(errs, pd.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("mesh: release: %w", err)
	}
	return nil
}

// Frames on the exchange connections: a 2-byte big-endian length, then the
// bytes.
func writeFrame(w io.Writer, b []byte) error {
	buf := make([]byte, 2+len(b))
	binary.BigEndian.PutUint16(buf, uint16(len(b)))
	copy(buf[2:], b)
	_, err := w.Write(buf)
	return err
}

func readFrame(r *bufio.Reader) ([]byte, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint16(hdr[:]))
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}
