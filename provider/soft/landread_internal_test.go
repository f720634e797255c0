package soft

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// pausingResponder accepts one TCP link and answers its first request, a
// READ, with a response whose payload stops halfway until resume is
// closed, as a peer process stopped (SIGSTOP) in the middle of writing
// it. It returns the peer's address and the payload it sends.
func pausingResponder(t *testing.T, size int, resume <-chan struct{}) (string, []byte) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i%251) + 1
	}
	served := make(chan net.Conn, 1)
	go func() {
		defer close(served)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		served <- conn
		var f frame
		var hdr [4 + headerLen]byte
		if _, err := readFrame(conn, hdr[:], &f); err != nil {
			return
		}
		writeHello(conn, frameHelloAck, 0, ln.Addr().String())
		if _, err := readFrame(conn, hdr[:], &f); err != nil || f.typ != frameRequest || f.op != verbs.OpRead {
			return
		}
		resp := frame{typ: frameResponse, op: verbs.OpRead, syn: synAck, dstQPN: f.srcQPN, srcQPN: f.dstQPN, psn: f.psn, gen: f.gen}
		resp.putHeader(hdr[:], size)
		if _, err := conn.Write(append(hdr[:], payload[:size/2]...)); err != nil {
			return
		}
		<-resume
		conn.Write(payload[size/2:])
	}()
	t.Cleanup(func() {
		ln.Close()
		if c, ok := <-served; ok {
			c.Close()
		}
	})
	return ln.Addr().String(), payload
}

// TestPostWhileReadLands: a READ response whose sender stops in the middle
// of its payload holds no lock of the requester QP while the rest is due.
// The link's reader used to land it holding the QP's lock, so a PostSend
// on the QP (a pump of krcored posting another client's request, holding
// that queue's lock in turn) waited for the peer to run again: with the
// peer stopped by a test that itself waited on that queue, forever
// (TestReclaimDrains). The READ still completes, with its bytes, once the
// rest arrives.
func TestPostWhileReadLands(t *testing.T) {
	const size = 64 << 10
	l := startLanding(t, size)
	q, mr, got := l.q, l.mr, l.got
	read := func(id uint64, at int) []verbs.SendWR {
		return []verbs.SendWR{{ID: id, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(mr, at, size)}, RemoteAddr: 1 << 20, RKey: 1}}
	}
	posted := make(chan error, 1)
	go func() {
		_, err := q.PostSend(read(2, size))
		posted <- err
	}()
	select {
	case err := <-posted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Error("PostSend waits for the rest of another request's READ response")
	}
	l.resume()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wc := make([]verbs.WC, 1)
	for {
		k, err := l.cq.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		if k > 0 {
			break
		}
		if err := l.cq.Wait(ctx); err != nil {
			t.Fatalf("no completion for the READ: %v", err)
		}
	}
	if wc[0].ID != 1 || wc[0].Status != verbs.Success || wc[0].ByteLen != size {
		t.Fatalf("READ completed %+v, want ID 1 SUCCESS of %d bytes", wc[0], size)
	}
	if !bytes.Equal(got, l.payload) {
		t.Fatal("the READ's bytes differ from the response's")
	}
}

// landing is a requester QP whose first READ of size bytes (into the
// start of its MR, of 2*size) a pausingResponder answers halfway: it is
// in the middle of the response, waiting for the rest, until resume.
type landing struct {
	q       verbs.QP
	cq      verbs.CQ
	mr      verbs.MR
	got     []byte // where the READ lands
	payload []byte
	resume  func()
}

// startLanding posts the READ and returns once its first half landed.
func startLanding(t *testing.T, size int) *landing {
	t.Helper()
	resume := make(chan struct{})
	var once sync.Once
	l := &landing{resume: func() { once.Do(func() { close(resume) }) }}
	t.Cleanup(l.resume)
	peer, payload := pausingResponder(t, size, resume)
	l.payload = payload
	n, err := NewNode(Config{Listen: "127.0.0.1:0", RetryTimeout: time.Minute, TCPOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	pd, _ := n.AllocPD()
	l.cq, _ = n.CreateCQ(16)
	blk, err := offheap.Alloc(2 * size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { blk.Close() })
	if l.mr, err = pd.RegMR(blk.Bytes(), verbs.AccessAll); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.mr.Close() })
	l.q, err = pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: l.cq, RecvCQ: l.cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxSendSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.q.Close() })
	if err := verbs.Connect(l.q, verbs.Endpoint{Addr: peer, QPN: 100}, verbs.Path{}); err != nil {
		t.Fatal(err)
	}
	wr := verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(l.mr, 0, size)}, RemoteAddr: 1 << 20, RKey: 1}
	if _, err := l.q.PostSend([]verbs.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	// The first half has landed: the reader is in the middle of the
	// response, waiting for the rest. (The MR is off the Go heap, written
	// by the socket read.)
	l.got = blk.Bytes()[:size]
	for end := time.Now().Add(30 * time.Second); l.got[size/2-1] == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the first half of the READ response never landed")
		}
	}
	return l
}

// TestDeregWhileReadLands: the Deregister of the MR a READ response lands
// in returns while the response's sender is stopped in its middle (it
// waited for the rest, the response holding the MR), over a TCP link's
// raw socket; the rest, once it comes, lands nowhere and the link serves
// on.
func TestDeregWhileReadLands(t *testing.T) {
	const size = 64 << 10
	l := startLanding(t, size)
	done := make(chan error, 1)
	go func() { done <- l.mr.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Deregister still waits for the rest of a stalled READ response after 30s")
	}
	before := bytes.Clone(l.got)
	l.resume()
	// A check that passes without looking if the reader is late to land
	// the rest, never one that fails for it.
	time.Sleep(100 * time.Millisecond)
	if !bytes.Equal(l.got, before) {
		t.Error("bytes landed in the MR after its Deregister returned")
	}
}
