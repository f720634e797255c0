package smc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// TestForgedConfirmInjects: a raw TCP client cannot have a server WRITE
// into another client's buffer. The victim's Node (node 1) dials the
// server (node 2) and also listens, as a proxy's does. The attacker, a
// process with no Node of its own, learns what the CLC shows it: from a
// proposal to the victim's listener in which it claims to be the server,
// the victim's node, port, a token and the name of the slab the victim
// exports to the server; from the server's accepts, the server's side.
// It then proposes to the server as the victim (the victim's node and
// port, the tokens next to the one it saw, as tokens were handed out) and
// confirms naming that slab, and then the one the victim's connection's
// buffer is in (as if its name leaked): each at the element the victim's
// connection uses and at a free one. The server's application greets
// every connection. The victim's connection, which its server
// connection wrote to before the forgeries and has not read yet, must
// read what that connection wrote and nothing else: neither a greeting
// notified with a guessed token nor one written over its bytes.
func TestForgedConfirmInjects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, srv, vic := twoNodes(t, ctx)
	lnS := listenAccepting(t, srv)
	lnV := listenAccepting(t, vic)

	x, sx := victimConn(t, ctx, lnS, vic)
	if _, err := sx.Write([]byte("legit")); err != nil {
		t.Fatal(err)
	}
	awaitWrites(t, ctx, sx)

	// What the victim's listener shows a client claiming to be the server.
	srvAcc := rawExchange(t, lnS.addr, &clcMsg{typ: clcProposal, peerID: 1, node: 1, port: vic.port, token: 1})
	(<-lnS.conns).Close()
	vicAcc := rawExchange(t, lnV.addr, &clcMsg{typ: clcProposal, peerID: srvAcc.peerID, node: srvAcc.node, port: srvAcc.port, token: 1})
	(<-lnV.conns).Close()
	t.Logf("the victim showed node %d port %#x token %#x buffer %q at %d", vicAcc.node, vicAcc.port, vicAcc.token, vicAcc.name, vicAcc.off)

	for _, name := range []string{vicAcc.name, SlabName(x)} {
		for _, off := range []uint32{0, 2 * vicAcc.size} {
			for back := uint32(1); back <= 3; back++ { // the tokens handed out just before
				forged := &clcMsg{typ: clcProposal, peerID: vicAcc.peerID, node: vicAcc.node, port: vicAcc.port, token: vicAcc.token - back}
				raw, _ := rawPropose(t, lnS.addr, forged)
				defer raw.Close()
				forged.typ, forged.name, forged.off, forged.size = clcConfirm, name, off, vicAcc.size
				if _, err := raw.Write(forged.encode()); err != nil {
					t.Fatal(err)
				}
				sa := <-lnS.conns
				defer sa.Close()
				greetAndSettle(t, ctx, sa)
			}
		}
	}
	t.Logf("the victim's connection: %s", State(x))

	sx.Close()
	x.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(x)
	if string(got) != "legit" || err != nil {
		t.Fatalf("the victim read %q (%v), want %q: the server wrote a forged connection's bytes into it", got, err, "legit")
	}
}

// acceptingListener is a listener whose accepted connections arrive on
// conns, from a goroutine that ends when the listener closes.
type acceptingListener struct {
	addr  string
	conns chan net.Conn
}

func listenAccepting(t *testing.T, n *Node) *acceptingListener {
	t.Helper()
	ln, err := Listen("tcp", "127.0.0.1:0", &Options{Node: n, HandshakeTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	l := &acceptingListener{addr: ln.Addr().String(), conns: make(chan net.Conn, 16)}
	go func() { // ends with ln, closed by the test's cleanup
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.conns <- c
		}
	}()
	return l
}

// rawPropose sends proposal p on a new TCP connection to addr and returns
// the connection and the server's accept.
func rawPropose(t *testing.T, addr string, p *clcMsg) (net.Conn, *clcMsg) {
	t.Helper()
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	raw.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := raw.Write(p.encode()); err != nil {
		t.Fatal(err)
	}
	m, _, err := readCLC(raw, clcAccept, clcDecline)
	if err != nil || m.typ != clcAccept {
		raw.Close()
		t.Fatalf("the answer to %+v: %+v, %v; want an accept", p, m, err)
	}
	return raw, m
}

// rawExchange is rawPropose, learning the accept only: the connection is
// closed.
func rawExchange(t *testing.T, addr string, p *clcMsg) *clcMsg {
	t.Helper()
	raw, m := rawPropose(t, addr, p)
	raw.Close()
	return m
}

// greetAndSettle writes the server application's greeting on sa and, if
// the write went out over SMC, waits for its WRITEs to complete.
func greetAndSettle(t *testing.T, ctx context.Context, sa net.Conn) {
	t.Helper()
	sa.SetWriteDeadline(time.Now().Add(30 * time.Second))
	if _, err := sa.Write([]byte("INJECTED")); err != nil {
		t.Logf("a forged connection's greeting: %v", err)
		return
	}
	awaitWrites(t, ctx, sa)
}

// awaitWrites waits until the WRITEs of c, an SMC connection, completed: the
// victimConn dials l from vic and returns both ends of the connection,
// which must be SMC; the test's end closes them.
func victimConn(t *testing.T, ctx context.Context, l *acceptingListener, vic *Node) (x, sx net.Conn) {
	t.Helper()
	x, err := DialContext(ctx, "tcp", l.addr, &Options{Node: vic})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close() })
	sx = <-l.conns
	t.Cleanup(func() { sx.Close() })
	if !ModeOf(x).SMC {
		t.Fatalf("the victim's connection: %v", ModeOf(x))
	}
	return x, sx
}

// peer's port has their notifications before anything sent later.
func awaitWrites(t *testing.T, ctx context.Context, sa net.Conn) {
	t.Helper()
	c := sa.(*Conn)
	for {
		c.mu.Lock()
		done := c.freed == c.sent || c.err != nil
		c.mu.Unlock()
		if done || !ModeOf(sa).SMC {
			t.Logf("%v: %s", ModeOf(sa), State(sa))
			return
		}
		if ctx.Err() != nil {
			t.Fatal(errors.New("the WRITE never completed"))
		}
		time.Sleep(time.Millisecond)
	}
}

// TestThirdPartyCDC: a process on the peer's node that knows a
// connection's token (all a notification names) cannot end it, nor move
// its cursors, with CDC messages of its own: without the connection's
// key they are dropped, and the connection carries its bytes as before.
func TestThirdPartyCDC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, srv, vic := twoNodes(t, ctx)
	lnS := listenAccepting(t, srv)
	x, sx := victimConn(t, ctx, lnS, vic)
	xc := x.(*Conn)
	xc.mu.Lock()
	token := xc.token
	xc.mu.Unlock()

	// A third party on the server's node: its own runtime's queue.
	third := core.Embed(cl.Node(2))
	q, err := third.Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Connect(ctx, 1, &krcore.ConnectOptions{Port: vic.port}); err != nil {
		t.Fatal(err)
	}
	mr, err := third.RegMR(cdcSlot, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer third.Deregister(mr)
	dropped := vic.dropped.Load()
	forged := []cdcMsg{
		{seq: 1, token: token, cons: toCursor(1<<20, cursorSpan), prodFlags: flagCursorRequest},
		{seq: 2, token: token, prod: toCursor(1<<10, cursorSpan), connFlags: flagDoneWriting | flagConnClosed},
		{seq: 3, token: token, connFlags: flagAbnormal},
	}
	for _, m := range forged {
		b := m.encode(mr.Bytes())
		if err := q.PushOne(ctx, true, krcore.Request{Op: verbs.OpSend, Local: mr.Range(0, len(b))}); err != nil {
			t.Fatal(err)
		}
		var out [1]krcore.Completion
		if _, err := q.PopWait(ctx, out[:]); err != nil || out[0].Err() != nil {
			t.Fatalf("the forged CDC's SEND: %v %v", err, out[0].Err())
		}
	}
	// Each forged message is dropped, or applied: wait for the one or
	// the other to show.
	for vic.dropped.Load() < dropped+uint64(len(forged)) {
		xc.mu.Lock()
		hit := xc.err != nil || xc.peerDoneWriting
		xc.mu.Unlock()
		if hit || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	echoBoth(t, x, sx)
	sx.Close()
	x.SetReadDeadline(time.Now().Add(30 * time.Second))
	if got, err := io.ReadAll(x); len(got) != 0 || err != nil {
		t.Fatalf("the victim read %q (%v) after its peer closed, want EOF: %s", got, err, State(x))
	}
}

// TestRogueAccept: a server cannot have a client WRITE into another
// server's buffer. The rogue learns the name of the slab the real server
// exports to the victim's Node by proposing to the real server as the
// victim; when the victim dials the rogue, it accepts naming the real
// server's endpoint and the element the victim's connection to it
// WRITEs into. The victim falls back to TCP instead, and its connection
// to the real server reads what the victim wrote to it and nothing else.
func TestRogueAccept(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, srv, vic := twoNodes(t, ctx)
	lnS := listenAccepting(t, srv)
	x, sx := victimConn(t, ctx, lnS, vic)
	if _, err := x.Write([]byte("legit")); err != nil {
		t.Fatal(err)
	}
	awaitWrites(t, ctx, x)

	srvAcc := rawExchange(t, lnS.addr, &clcMsg{typ: clcProposal, peerID: vic.id, node: 1, port: vic.port, token: 1})
	(<-lnS.conns).Close()
	rogue, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer rogue.Close()
	accept := *srvAcc
	accept.off = 0 // the element the victim's first connection WRITEs into
	served := make(chan error, 1)
	go func() { // ends with its connection, which the victim closes
		served <- rogueServer(rogue, &accept)
	}()
	r, err := DialContext(ctx, "tcp", rogue.Addr().String(), &Options{Node: vic})
	if err != nil {
		t.Fatal(err)
	}
	if m := ModeOf(r); m.SMC {
		t.Errorf("the victim's connection to the rogue: %v", m)
	}
	r.Write([]byte("evil"))
	r.Close()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	x.Close()
	sx.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(sx)
	if string(got) != "legit" || err != nil {
		t.Fatalf("the server read %q (%v), want %q: %s", got, err, "legit", State(sx))
	}
}

// rogueServer accepts one connection on l, answers its proposal with
// accept and reads what follows to the end.
func rogueServer(l net.Listener, accept *clcMsg) error {
	s, err := l.Accept()
	if err != nil {
		return err
	}
	defer s.Close()
	s.SetDeadline(time.Now().Add(30 * time.Second))
	if m, _, err := readCLC(s, clcProposal); err != nil {
		return fmt.Errorf("the proposal: %+v %v", m, err)
	}
	if _, err := s.Write(accept.encode()); err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, s)
	return err
}
