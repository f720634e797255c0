package smc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/bounded"
)

// TestHostileHandshakes: clients that break off the CLC handshake every
// way a raw TCP client can, many at once, leave the server's accepted
// connections settled within the handshake timeout (no Handshake, Read or
// Close hangs), the bytes a client sent that are not a whole proposal
// readable by the application once each, and no token registered.
func TestHostileHandshakes(t *testing.T) {
	srv, cli, ln := rawClientRig(t, 500*time.Millisecond)
	proposal := (&clcMsg{typ: clcProposal, peerID: cli.id, node: 1, port: cli.port, token: 7}).encode()
	confirmBad := (&clcMsg{typ: clcConfirm, peerID: cli.id, node: 1, port: cli.port, token: 7, name: "no such region"}).encode()
	type client struct {
		name string
		// sent: the bytes the client writes; then it closes its side
		// (closes) or stays silent; answered: it reads the server's
		// answer to its proposal before that.
		sent     []byte
		closes   bool
		answered bool
		// keep: the bytes the server's application reads (nil: its
		// read fails or ends with no byte).
		keep []byte
	}
	clients := []client{
		{name: "half a header, then close", sent: proposal[:5], closes: true, keep: proposal[:5]},
		{name: "a header and part of the body, then close", sent: proposal[:20], closes: true, keep: proposal[:20]},
		{name: "a proposal less its trailer, then close", sent: proposal[:len(proposal)-1], closes: true, keep: proposal[:len(proposal)-1]},
		{name: "a proposal, then close", sent: proposal, closes: true},
		{name: "a proposal, the accept read, then close", sent: proposal, closes: true, answered: true},
		{name: "a proposal, then silence", sent: proposal},
		{name: "a proposal, the accept read, then silence", sent: proposal, answered: true},
		{name: "a proposal and a confirm of a region never exported", sent: append(append([]byte{}, proposal...), confirmBad...), answered: true},
		{name: "a proposal and half a confirm, then close", sent: append(append([]byte{}, proposal...), confirmBad[:10]...), closes: true, answered: true},
	}
	const copies = 4 // each client at once, several times
	var wg sync.WaitGroup
	errs := make(chan error, len(clients)*copies)
	for _, cl := range clients {
		for range copies {
			raw, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			s, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() { // owned by the test, which waits for it
				defer wg.Done()
				defer s.Close()
				errs <- hostileClient(raw, s, cl.sent, cl.closes, cl.answered, cl.keep, cl.name)
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if left := srv.tokens(); left != 0 {
		t.Errorf("%d tokens still registered", left)
	}
}

// hostileClient plays one client of TestHostileHandshakes on raw against
// the server's accepted s: nil, or what went wrong.
func hostileClient(raw net.Conn, s net.Conn, sent []byte, closes, answered bool, keep []byte, name string) error {
	fail := func(format string, a ...any) error {
		return fmt.Errorf("%s: "+format, append([]any{name}, a...)...)
	}
	if answered {
		first := int(binary.BigEndian.Uint16(sent[5:])) // the proposal's length
		if _, err := raw.Write(sent[:first]); err != nil {
			return fail("write: %v", err)
		}
		raw.SetReadDeadline(time.Now().Add(10 * time.Second))
		if m, _, err := readCLC(raw, clcAccept, clcDecline); err != nil || m.typ != clcAccept {
			return fail("answer to the proposal: %+v, %v; want an accept", m, err)
		}
		if rest := sent[first:]; len(rest) > 0 {
			if _, err := raw.Write(rest); err != nil {
				return fail("write: %v", err)
			}
		}
	} else if _, err := raw.Write(sent); err != nil {
		return fail("write: %v", err)
	}
	if closes {
		raw.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sc := s.(*Conn)
	if err := sc.Handshake(ctx); err != nil && ctx.Err() != nil {
		return fail("Handshake: %v", err)
	}
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(s)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return fail("read timed out (%d bytes read), mode %v", len(got), ModeOf(s))
	}
	if !bytes.Equal(got, keep) {
		return fail("read %x (%v), want %x", got, err, keep)
	}
	if ModeOf(s).SMC {
		return fail("mode %v", ModeOf(s))
	}
	return nil
}

// TestCloseMidHandshake: an accepted connection closed while its client,
// having proposed and read the accept, says nothing more (the handshake
// timeout far off) closes at once: Close returns, a Read waiting and
// Handshake fail, and the token goes back.
func TestCloseMidHandshake(t *testing.T) {
	srv, cli, ln := rawClientRig(t, time.Hour)
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Write((&clcMsg{typ: clcProposal, peerID: cli.id, node: 1, port: cli.port, token: 7}).encode()); err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	if m, _, err := readCLC(raw, clcAccept, clcDecline); err != nil || m.typ != clcAccept {
		t.Fatalf("answer to the proposal: %+v, %v; want an accept", m, err)
	}
	read := make(chan error, 1)
	go func() { // ends with s's Close, which the test waits for below
		_, err := s.Read(make([]byte, 1))
		read <- err
	}()
	if err := bounded.Within(t, 10*time.Second, "Close mid-handshake", s.Close); err != nil {
		t.Fatal(err)
	}
	// A Read that had not begun waiting when Close came sees the
	// handshake that Close broke off (ECONNRESET), one waiting sees the
	// Close (net.ErrClosed): which one, the scheduler decides.
	err = bounded.Within(t, 10*time.Second, "a Read waiting", func() error { return <-read })
	if !errors.Is(err, net.ErrClosed) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("a Read waiting for the handshake: %v, want net.ErrClosed or ECONNRESET", err)
	}
	if err := bounded.Within(t, 10*time.Second, "Handshake", func() error { return s.(*Conn).Handshake(context.Background()) }); err == nil {
		t.Fatal("Handshake of the connection closed mid-handshake: nil")
	}
	if left := srv.tokens(); left != 0 {
		t.Fatalf("%d tokens still registered", left)
	}
}

// rawClientRig is a listener on node 2's Node, with handshake timeout
// hs, and a Node on node 1 for raw clients to name in their CLC messages
// (its port and instance): it connects to nothing itself.
func rawClientRig(t *testing.T, hs time.Duration) (srv, cli *Node, ln *Listener) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, srv, cli = twoNodes(t, ctx)
	var err error
	if ln, err = Listen("tcp", "127.0.0.1:0", &Options{Node: srv, HandshakeTimeout: hs}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return srv, cli, ln
}

// tokens is how many connections of n hold a token.
func (n *Node) tokens() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.conns)
}

// TestHostileServers: servers that answer a proposal with half an accept
// and close, an accept naming a buffer never exported, or a decline of the
// wrong length leave the dialled connection on TCP within the handshake
// timeout, with nothing of the server's bytes lost or made up: what was
// not a whole CLC message is the application's, and after a decline the
// server's next bytes are.
func TestHostileServers(t *testing.T) {
	srvNode, cliNode, _ := rawClientRig(t, time.Second)
	accept := (&clcMsg{typ: clcAccept, peerID: srvNode.id, node: 2, port: srvNode.port, token: 9, size: 64 << 10, name: "never exported"}).encode()
	badDecline := (&clcMsg{typ: clcDecline, peerID: srvNode.id, reason: ReasonMem}).encode()
	badDecline[6]-- // a length RFC 7609's decline does not have
	badDecline = badDecline[:len(badDecline)-1]
	copy(badDecline[len(badDecline)-clcTrlLen:], eyecatcher[:])
	for _, tc := range []struct {
		name string
		// answer is written after the proposal; then, with close, the
		// server closes, else it reads the client's answer (a decline,
		// declined) and writes "after".
		answer   []byte
		close    bool
		declined bool
		want     string // what the client's application reads
	}{
		{name: "half an accept, then close", answer: accept[:10], close: true, want: string(accept[:10])},
		{name: "an accept naming a buffer never exported", answer: accept, declined: true, want: "after"},
		{name: "a decline of the wrong length", answer: badDecline, want: string(badDecline) + "after"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			served := make(chan error, 1)
			go func() { // ends with its connection, which the client closes
				served <- hostileServer(l, tc.answer, tc.close, tc.declined)
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := DialContext(ctx, "tcp", l.Addr().String(), &Options{Node: cliNode, HandshakeTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if m := ModeOf(c); m.SMC {
				t.Fatalf("mode %v", m)
			}
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			got, err := io.ReadAll(c)
			if string(got) != tc.want {
				t.Fatalf("read %q (%v), want %q", got, err, tc.want)
			}
			if err := <-served; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// hostileServer accepts one connection on l, reads a proposal and answers
// it with answer; then it closes, or reads the client's decline (when
// declined) and writes "after" before it closes its writing side.
func hostileServer(l net.Listener, answer []byte, closes, declined bool) error {
	s, err := l.Accept()
	if err != nil {
		return err
	}
	defer s.Close()
	s.SetDeadline(time.Now().Add(10 * time.Second))
	if m, _, err := readCLC(s, clcProposal); err != nil {
		return fmt.Errorf("the proposal: %+v %v", m, err)
	}
	if _, err := s.Write(answer); err != nil || closes {
		return err
	}
	if declined {
		if m, _, err := readCLC(s, clcDecline); err != nil {
			return fmt.Errorf("the client's decline: %+v %v", m, err)
		}
	}
	if _, err := s.Write([]byte("after")); err != nil {
		return err
	}
	return s.(*net.TCPConn).CloseWrite()
}
