package smc

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestSilentClient: a client that proposes, gets the accept and then says
// nothing breaks its accepted connection after the handshake timeout:
// reads fail (it may have confirmed unseen, so TCP is not safe), and the
// server's buffer goes back.
func TestSilentClient(t *testing.T) {
	srv, cli, ln := rawClientRig(t, 300*time.Millisecond)
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	p := &clcMsg{typ: clcProposal, peerID: cli.id, node: 1, port: cli.port, token: 7}
	if _, err := raw.Write(p.encode()); err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m, _, err := readCLC(raw, clcAccept, clcDecline)
	if err != nil || m.typ != clcAccept {
		t.Fatalf("answer to the proposal: %+v, %v; want an accept", m, err)
	}
	start := time.Now()
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = s.Read(make([]byte, 1))
	var ne net.Error
	if !errors.Is(err, syscall.ECONNRESET) || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("read on a connection whose client went silent: %v, want ECONNRESET, not a timeout", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("the failure took %v", d)
	}
	if m := ModeOf(s); m.SMC || m.Reason != ReasonSync {
		t.Fatalf("mode %v", m)
	}
	if left := srv.tokens(); left != 0 {
		t.Fatalf("%d tokens still registered", left)
	}
}

// TestTogether: together reports f's failure before g's, else g's, and
// runs the two at once: an f that waits for g to begin does not hold g up.
func TestTogether(t *testing.T) {
	errF, errG := errors.New("f failed"), errors.New("g failed")
	step := func(r Reason, err error) func() (Reason, error) {
		return func() (Reason, error) { return r, err }
	}
	for _, tc := range []struct {
		f, g func() (Reason, error)
		r    Reason
		err  error
	}{
		{step(ReasonNone, nil), step(ReasonNone, nil), ReasonNone, nil},
		{step(ReasonLink, errF), step(ReasonMem, errG), ReasonLink, errF},
		{step(ReasonNone, nil), step(ReasonMem, errG), ReasonMem, errG},
		{step(ReasonLink, errF), step(ReasonNone, nil), ReasonLink, errF},
	} {
		if r, err := together(tc.f, tc.g); r != tc.r || err != tc.err {
			t.Errorf("together: %v, %v; want %v, %v", r, err, tc.r, tc.err)
		}
	}
	gBegan := make(chan struct{})
	f := func() (Reason, error) {
		select {
		case <-gBegan:
			return ReasonNone, nil
		case <-time.After(20 * time.Second):
			return ReasonInternal, errors.New("g did not begin while f ran")
		}
	}
	g := func() (Reason, error) {
		close(gBegan)
		return ReasonNone, nil
	}
	if _, err := together(f, g); err != nil {
		t.Fatal(err)
	}
}
