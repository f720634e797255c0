package smc_test

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/krcore/krcore/smc"
)

// connState is the state Conns reports for the connection whose local
// address is c's, or "" when it lists none.
func connState(n *smc.Node, c net.Conn) (smc.ConnInfo, bool) {
	for _, ci := range n.Conns() {
		if ci.Local == c.LocalAddr().String() && ci.Foreign == c.RemoteAddr().String() {
			return ci, true
		}
	}
	return smc.ConnInfo{}, false
}

// TestConns: Node.Conns lists a Node's connections as smcss does through
// their life: an accepted one before its client spoke (INIT), over SMC
// (ACTIVE, cursors moving), half-closed each way (APPCLW, PEERCLW), a
// fallback with its reason, an aborted one when the peer died, and none
// once closed; the report survives JSON.
func TestConns(t *testing.T) {
	srvAPI, clients := apis(t)
	srvNode, err := smc.Open(srvAPI, smc.NodeOptions{BufferSize: smc.MinBufferSize})
	if err != nil {
		t.Fatal(err)
	}
	cliNode := open(t, clients["embedded"], smc.NodeOptions{BufferSize: smc.MinBufferSize})
	ln := listen(t, &smc.Options{Node: srvNode})

	plain, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	ps, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	if ci, ok := connState(srvNode, ps); !ok || ci.State != "INIT" || ci.Mode != "pending" || ci.Role != "server" {
		t.Errorf("before the client spoke: %+v %v", ci, ok)
	}
	plain.Write([]byte("x"))
	if m := settled(t, ps); m.SMC {
		t.Fatal("a plain client ran SMC")
	}
	if ci, _ := connState(srvNode, ps); ci.State != "ACTIVE" || ci.Mode != "TCP" || ci.Reason != smc.ReasonPeerNoSMC {
		t.Errorf("fallback: %+v", ci)
	}

	s, c := pair(t, ln, &smc.Options{Node: cliNode})
	settled(t, s)
	werr := make(chan error, 1)
	const sent = smc.MinBufferSize + 904
	go func() { _, err := c.Write(make([]byte, sent)); werr <- err }() // wraps the ring
	if _, err := io.ReadFull(s, make([]byte, sent)); err != nil {
		t.Fatal(err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	ci, _ := connState(cliNode, c)
	want := smc.Cursor{Wrap: 1, Off: sent - smc.MinBufferSize}
	if ci.State != "ACTIVE" || ci.Role != "client" || ci.Mode != "SMC" || ci.Sent != want || ci.BytesSent != sent ||
		ci.RMB != smc.MinBufferSize || ci.PeerRMB != smc.MinBufferSize || ci.Token == 0 || ci.PeerToken == 0 || ci.PeerNode != srvAPI.Node() {
		t.Errorf("client after %d bytes: %+v", sent, ci)
	}
	if si, _ := connState(srvNode, s); si.Prod != want || si.Cons != want || si.Token != ci.PeerToken {
		t.Errorf("server after %d bytes: %+v", sent, si)
	}

	c.(*smc.Conn).CloseWrite()
	if _, err := io.ReadAll(s); err != nil {
		t.Fatal(err)
	}
	if ci, _ := connState(cliNode, c); ci.State != "APPCLW" {
		t.Errorf("after CloseWrite: %s", ci.State)
	}
	if si, _ := connState(srvNode, s); si.State != "PEERCLW" {
		t.Errorf("after the peer's CloseWrite: %s", si.State)
	}

	// The report as krcored keeps it.
	b, err := json.Marshal(srvNode.Report())
	if err != nil {
		t.Fatal(err)
	}
	var rep smc.Report
	if err := json.Unmarshal(b, &rep); err != nil || len(rep.Conns) != 2 || rep.Stats.Fallbacks[smc.ReasonPeerNoSMC] != 1 ||
		rep.Conns[0].Reason != smc.ReasonPeerNoSMC || rep.Port != srvNode.Port() {
		t.Errorf("report round trip: %v %s", err, b)
	}

	// The server's Node dies: the client's connection aborts.
	srvNode.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := c.Read(make([]byte, 1))
		if errors.Is(err, syscall.ECONNRESET) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("read after the peer's death: %v", err)
		}
	}
	if ci, _ := connState(cliNode, c); ci.State != "ABORTED" {
		t.Errorf("after the peer died: %s", ci.State)
	}
	c.Close()
	if _, ok := connState(cliNode, c); ok || len(cliNode.Conns()) != 0 {
		t.Errorf("a closed connection is still listed: %+v", cliNode.Conns())
	}
}

// TestReasonText: reasons print as Linux's tools print their codes and
// read back; a code that is not hex is an error.
func TestReasonText(t *testing.T) {
	b, _ := smc.ReasonPeerNoSMC.MarshalText()
	var r smc.Reason
	if string(b) != "0x03010000" || r.UnmarshalText(b) != nil || r != smc.ReasonPeerNoSMC || smc.ReasonPeerNoSMC.Text() != "peer did not indicate SMC" {
		t.Errorf("%s -> %v", b, r)
	}
	if err := r.UnmarshalText([]byte("peer")); err == nil {
		t.Error("a reason that is no code parsed")
	}
}
