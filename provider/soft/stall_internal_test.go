package soft

import (
	"bytes"
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
	srq    verbs.SRQ  // stallTarget's, if it made one
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
// for the rest of the payload, with the QP's lock held across its read)
// nor the Deregister of the MR it lands in (it waited for the copy), on an
// RC QP, an RC QP on an SRQ and a DCT; the request is then lost, as one
// cut short by its link: a WRITE is not answered, a SEND's receive is
// flushed with the QP's others when the QP goes to ERR, dropped with it
// when it is destroyed, put back when its MR goes, and never completes
// SUCCESS; no byte lands in a deregistered MR once Deregister returned.
// The link serves on.
func TestStalledPayload(t *testing.T) {
	const size = 4 << 20 // more than the link reader buffers: it is in the payload
	for _, c := range []struct {
		name   string
		op     verbs.Opcode
		target string // "rc", "srq" (RC on an SRQ), "dct" (on an SRQ)
		cut    string // "destroy", "error" (Modify to ERR), "dereg"
	}{
		{"write/destroy", verbs.OpWrite, "rc", "destroy"},
		{"send/error", verbs.OpSend, "rc", "error"},
		{"send/destroy", verbs.OpSend, "rc", "destroy"},
		{"write/dereg", verbs.OpWrite, "rc", "dereg"},
		{"send/dereg", verbs.OpSend, "rc", "dereg"},
		{"srq-send/error", verbs.OpSend, "srq", "error"},
		{"srq-send/destroy", verbs.OpSend, "srq", "destroy"},
		{"srq-send/dereg", verbs.OpSend, "srq", "dereg"},
		{"dct-write/destroy", verbs.OpWrite, "dct", "destroy"},
		{"dct-send/destroy", verbs.OpSend, "dct", "destroy"},
		{"dct-write/dereg", verbs.OpWrite, "dct", "dereg"},
		{"dct-send/dereg", verbs.OpSend, "dct", "dereg"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newStallRig(t, size)
			q, f := r.stallTarget(t, c.target, c.op)
			other := r.rc(t, 6)
			post := []verbs.RecvWR{{ID: 77, SGL: []verbs.SGE{verbs.SGEOf(r.mr, 0, size)}}}
			if c.target == "rc" {
				if _, err := q.PostRecv(post); err != nil {
					t.Fatal(err)
				}
			} else if _, err := r.srq.PostRecv(post); err != nil {
				t.Fatal(err)
			}
			payload := bytes.Repeat([]byte{0xab}, size)
			r.send(t, f, payload, size-1) // returns once the node read it: the request waits for its last byte
			done := make(chan error, 1)
			go func() {
				switch c.cut {
				case "error":
					done <- q.Modify(verbs.QPAttr{State: verbs.StateErr})
				case "destroy":
					done <- q.Close()
				default:
					done <- r.mr.Close()
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
				t.Fatalf("%s still waits for the rest of a stalled payload after 30s", c.cut)
			}
			mem := r.mr.Bytes()
			before := bytes.Clone(mem)
			if _, err := r.far.Write(payload[size-1:]); err != nil {
				t.Fatal(err)
			}
			read := frame{typ: frameRequest, op: verbs.OpRead, dstQPN: other.Num(), srcQPN: 6, rkey: r.mr.RKey(), raddr: r.mr.Addr(), rlen: 8}
			r.send(t, read, nil, 0)
			for got := range r.frames { // in order: the stalled request was served before
				if got.srcQPN == q.Num() {
					t.Fatalf("the stalled %v was answered (syndrome %d) after its %s", c.op, got.syn, c.cut)
				}
				if got.srcQPN == other.Num() {
					break
				}
			}
			if c.cut == "dereg" && !bytes.Equal(mem, before) {
				t.Errorf("bytes landed in the MR after its Deregister returned")
			}
			wc := make([]verbs.WC, 4)
			n, err := r.cq.Poll(wc)
			if err != nil {
				t.Fatal(err)
			}
			want := 0
			if c.cut == "error" && c.op == verbs.OpSend {
				want = 1
			}
			if n != want || n == 1 && (wc[0].ID != 77 || wc[0].Status != verbs.WRFlushErr) {
				t.Fatalf("%d completions %+v, want %d: the receive flushed", n, wc[:n], want)
			}
		})
	}
}

// stallTarget makes the QP a stalled request goes to (target as
// TestStalledPayload's) and the request's frame, without its payload.
func (r *stallRig) stallTarget(t *testing.T, target string, op verbs.Opcode) (verbs.QP, frame) {
	t.Helper()
	f := frame{typ: frameRequest, op: op, srcQPN: 5, rkey: r.mr.RKey(), raddr: r.mr.Addr()}
	if target == "rc" {
		q := r.rc(t, 5)
		f.dstQPN = q.Num()
		return q, f
	}
	srq, err := r.pd.CreateSRQ(verbs.SRQInit{MaxWR: 4, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	r.srq = srq
	t.Cleanup(func() { srq.Close() })
	if target == "srq" {
		q, err := r.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: r.cq, RecvCQ: r.cq, SRQ: srq, Cap: verbs.QPCap{MaxSendWR: 4}})
		if err != nil {
			t.Fatal(err)
		}
		if err := verbs.Connect(q, verbs.Endpoint{Addr: stallPeer, QPN: 5}, verbs.Path{}); err != nil {
			t.Fatal(err)
		}
		f.dstQPN = q.Num()
		return q, f
	}
	q, err := r.pd.CreateQP(verbs.QPInit{Type: verbs.DCT, SendCQ: r.cq, RecvCQ: r.cq, SRQ: srq, DCKey: 42})
	if err != nil {
		t.Fatal(err)
	}
	if err := verbs.Ready(q, verbs.Path{}); err != nil {
		t.Fatal(err)
	}
	f.dstQPN, f.flags, f.dckey = q.Num(), flagDC, 42
	return q, f
}
