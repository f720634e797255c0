package soft

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// stallRig is a node whose QPs talk to a peer the test plays by hand on
// the far end of a link (net.Pipe: a Write returns once the node read it).
type stallRig struct {
	n      *Node
	pd     verbs.PD
	cq     verbs.CQ
	mr     verbs.MR
	far    net.Conn
	frames chan frame // what the node sends the peer
}

const stallPeer = "stall:peer"

func newStallRig(t *testing.T, size int) *stallRig {
	t.Helper()
	n, err := NewNode(Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	r := &stallRig{n: n, frames: make(chan frame, 64)}
	r.pd, _ = n.AllocPD()
	if r.cq, err = n.CreateCQ(64); err != nil {
		t.Fatal(err)
	}
	blk, err := offheap.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	if r.mr, err = r.pd.RegMR(blk.Bytes(), verbs.AccessAll); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.mr.Close(); blk.Close() })
	near, far := net.Pipe()
	r.far = far
	l := newTCPLink(n, stallPeer)
	l.conn = near
	read := make(chan struct{})
	go func() {
		defer close(read)
		n.readLoop(l, near)
	}()
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		defer close(r.frames)
		for {
			b := make([]byte, 4+headerLen)
			var f frame
			if _, err := io.ReadFull(far, b); err != nil || decodeHeader(b, &f) != nil {
				return
			}
			if _, err := io.CopyN(io.Discard, far, int64(f.plen)); err != nil {
				return
			}
			r.frames <- f
		}
	}()
	t.Cleanup(func() { // the link's goroutines end with it
		far.Close()
		<-read
		for range r.frames {
		}
		<-drained
	})
	return r
}

// rc is an RC QP connected to the peer's QP qpn.
func (r *stallRig) rc(t *testing.T, qpn uint32) verbs.QP {
	t.Helper()
	q, err := r.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: r.cq, RecvCQ: r.cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := verbs.Connect(q, verbs.Endpoint{Addr: stallPeer, QPN: qpn}, verbs.Path{}); err != nil {
		t.Fatal(err)
	}
	return q
}

// send writes f, with payload's first cut bytes, as the peer.
func (r *stallRig) send(t *testing.T, f frame, payload []byte, cut int) {
	t.Helper()
	b := make([]byte, 4+headerLen)
	f.putHeader(b, len(payload))
	r.far.SetWriteDeadline(time.Now().Add(time.Minute))
	if _, err := r.far.Write(append(b, payload[:cut]...)); err != nil {
		t.Fatal(err)
	}
}

// TestStalledPayload: a request whose payload stalls in its middle (its
// sender stopped) blocks neither Destroy nor Modify of its QP (they waited
// for the rest of the payload, with the QP's lock held across its read);
// the request is then lost, as one cut short by its link: a WRITE to a
// destroyed QP is not answered, a SEND's receive is flushed with the QP's
// others when the QP goes to ERR, or dropped with it when it is
// destroyed, and never completes SUCCESS. The link serves on.
func TestStalledPayload(t *testing.T) {
	const size = 4 << 20 // more than the link reader buffers: it is in the payload
	for _, c := range []struct {
		name   string
		op     verbs.Opcode
		modify bool // Modify to ERR, else Destroy
	}{
		{"write/destroy", verbs.OpWrite, false},
		{"send/error", verbs.OpSend, true},
		{"send/destroy", verbs.OpSend, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newStallRig(t, size)
			q, other := r.rc(t, 5), r.rc(t, 6)
			post := []verbs.RecvWR{{ID: 77, SGL: []verbs.SGE{verbs.SGEOf(r.mr, 0, size)}}}
			if _, err := q.PostRecv(post); err != nil {
				t.Fatal(err)
			}
			payload := make([]byte, size)
			f := frame{typ: frameRequest, op: c.op, dstQPN: q.Num(), srcQPN: 5, rkey: r.mr.RKey(), raddr: r.mr.Addr()}
			r.send(t, f, payload, size-1)
			done := make(chan error, 1)
			go func() {
				if c.modify {
					done <- q.Modify(verbs.QPAttr{State: verbs.StateErr})
				} else {
					done <- q.Close()
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-ctx.Done():
				t.Fatal("Modify or Destroy still waits for the rest of a stalled payload after 30s")
			}
			if _, err := r.far.Write(payload[size-1:]); err != nil {
				t.Fatal(err)
			}
			read := frame{typ: frameRequest, op: verbs.OpRead, dstQPN: other.Num(), srcQPN: 6, rkey: r.mr.RKey(), raddr: r.mr.Addr(), rlen: 8}
			r.send(t, read, nil, 0)
			for got := range r.frames { // in order: the stalled request was served before
				if got.srcQPN == q.Num() {
					t.Fatalf("the stalled %v was answered (syndrome %d) after its QP was cut", c.op, got.syn)
				}
				if got.srcQPN == other.Num() {
					break
				}
			}
			wc := make([]verbs.WC, 4)
			n, err := r.cq.Poll(wc)
			if err != nil {
				t.Fatal(err)
			}
			want := 0
			if c.modify {
				want = 1
			}
			if n != want || n == 1 && (wc[0].ID != 77 || wc[0].Status != verbs.WRFlushErr) {
				t.Fatalf("%d completions %+v, want %d: the receive flushed", n, wc[:n], want)
			}
		})
	}
}
