package smc

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
)

// twoNodes starts a two-node cluster and opens a Node on each, embedded:
// srv on node 2, cli on node 1; the test's end closes them all.
func twoNodes(t *testing.T, ctx context.Context) (c *cluster.Cluster, srv, cli *Node) {
	t.Helper()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	for i, n := range []**Node{&srv, &cli} {
		if *n, err = Open(core.Embed(c.Node(krcore.NodeID(2-i))), NodeOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { (*n).Close() })
	}
	return c, srv, cli
}

// acceptRig is a listener on node 2's Node and a Node on node 1 that
// connected to it once (its queue and slabs exist on both sides; the
// connection is closed and released).
type acceptRig struct {
	srv, cli *Node
	ln       *Listener
}

func newAcceptRig(t *testing.T, ctx context.Context) *acceptRig {
	t.Helper()
	r := &acceptRig{}
	_, r.srv, r.cli = twoNodes(t, ctx)
	var err error
	if r.ln, err = Listen("tcp", "127.0.0.1:0", &Options{Node: r.srv}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.ln.Close() })
	acc := make(chan net.Conn, 1)
	go func() {
		s, _ := r.ln.Accept()
		acc <- s
	}()
	cc, err := DialContext(ctx, "tcp", r.ln.Addr().String(), &Options{Node: r.cli})
	if err != nil {
		t.Fatal(err)
	}
	s := <-acc
	if s == nil || !ModeOf(cc).SMC {
		t.Fatalf("first connection: %v", ModeOf(cc))
	}
	cc.Close()
	s.Close()
	// Both released: the server's queue to the client is unused again.
	for !r.srv.idleQueues() {
		if ctx.Err() != nil {
			t.Fatal("the first connection's queue stayed in use")
		}
		time.Sleep(time.Millisecond)
	}
	return r
}

// idleQueues reports whether n has queues and none is in use.
func (n *Node) idleQueues() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	k := 0
	for _, qs := range n.queues {
		for _, q := range qs {
			if q.users > 0 {
				return false
			}
			k++
		}
	}
	return k > 0
}

// proposeRaw connects to ln over plain TCP and writes a proposal of a
// client Conn on cli but its last missing bytes (returned), whose
// handshake the test finishes.
func (r *acceptRig) proposeRaw(t *testing.T, missing int) (*Conn, []byte) {
	t.Helper()
	tc, err := dialTCP(context.Background(), "tcp", r.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cc := newConn(tc, &Options{Node: r.cli}, false)
	t.Cleanup(func() { cc.Close() })
	if _, err := cc.setupQueue(true); err != nil {
		t.Fatal(err)
	}
	p := cc.offer(clcProposal).encode()
	if _, err := tc.Write(p[:len(p)-missing]); err != nil {
		t.Fatal(err)
	}
	return cc, p[len(p)-missing:]
}

// finishClient is the client's side after its proposal: the accept, its
// buffer, the confirm.
func finishClient(t *testing.T, ctx context.Context, cc *Conn) {
	t.Helper()
	cc.tcp.SetReadDeadline(time.Now().Add(10 * time.Second))
	m, _, err := readCLC(cc.tcp, clcAccept, clcDecline)
	if err != nil || m.typ != clcAccept {
		t.Fatalf("answer to the proposal: %+v, %v; want an accept", m, err)
	}
	cc.tcp.SetReadDeadline(time.Time{})
	if _, err := cc.connectPeer(ctx, m, true); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.learnBuffer(ctx, m); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.setupRMB(krcore.Principal{Node: m.node, Port: m.port}, true); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.tcp.Write(cc.offer(clcConfirm).encode()); err != nil {
		t.Fatal(err)
	}
	cc.startSMC()
	cc.decide(Mode{SMC: true}, true)
}

// echoBoth checks that bytes cross both ways between the two ends.
func echoBoth(t *testing.T, a, b net.Conn) {
	t.Helper()
	for _, d := range [][2]net.Conn{{a, b}, {b, a}} {
		msg := []byte("across " + d[0].LocalAddr().String())
		if _, err := d[0].Write(msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		d[1].SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(d[1], got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("read %q, %v; want %q", got, err, msg)
		}
	}
}

// TestAcceptAnswersWaitingProposal: a proposal already in the socket when
// Accept runs is answered by Accept itself (the receive buffer is taken
// before Accept returns) once the queue and slabs exist; a part of one is
// left for the detection, which answers once the rest comes; both run
// over SMC.
func TestAcceptAnswersWaitingProposal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := newAcceptRig(t, ctx)
	// A loopback write is in the peer's socket when it returns, unless
	// the kernel deferred its receive processing (a loaded machine):
	// a whole proposal gets a few tries to be answered in Accept.
	answeredWhole := false
	for try := 0; try < 5 && !answeredWhole; try++ {
		answeredWhole = r.acceptOne(t, ctx, 0)
	}
	if !answeredWhole {
		t.Fatal("a whole proposal waiting was never answered in Accept")
	}
	if r.acceptOne(t, ctx, 10) {
		t.Fatal("a proposal 10 bytes short was answered in Accept")
	}
}

// acceptOne proposes with the last missing bytes held back until Accept
// returned, finishes the handshake, checks that both ends run over SMC
// and carry bytes, and reports whether Accept answered the proposal.
func (r *acceptRig) acceptOne(t *testing.T, ctx context.Context, missing int) bool {
	cc, rest := r.proposeRaw(t, missing)
	s, err := r.ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	sc := s.(*Conn)
	t.Cleanup(func() { sc.Close() })
	sc.mu.Lock()
	answered := sc.rmb.s != nil
	sc.mu.Unlock()
	if _, err := cc.tcp.Write(rest); err != nil {
		t.Fatal(err)
	}
	finishClient(t, ctx, cc)
	if err := sc.Handshake(ctx); err != nil || !ModeOf(sc).SMC {
		t.Fatalf("%d bytes missing: server %v, %v", missing, ModeOf(sc), err)
	}
	echoBoth(t, cc, sc)
	return answered
}

// TestProposalWaitingLeavesOtherBytes: bytes that are not a proposal stay
// in the socket for the detection, which hands them to the application.
func TestProposalWaitingLeavesOtherBytes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := newAcceptRig(t, ctx)
	raw, err := net.Dial("tcp", r.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	// An SMC eyecatcher that is not a CLC message: the detection must
	// see all of it.
	want := append(append([]byte{}, eyecatcher[:]...), []byte("\x09 not CLC\n")...)
	if _, err := raw.Write(want); err != nil {
		t.Fatal(err)
	}
	s, err := r.ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := make([]byte, len(want))
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %q, %v; want %q", got, err, want)
	}
	if m := ModeOf(s); m.SMC || m.Reason != ReasonPeerNoSMC {
		t.Fatalf("mode %v", m)
	}
}
