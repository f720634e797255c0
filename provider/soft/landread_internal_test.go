package soft

import (
	"bytes"
	"context"
	"net"
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
	resume := make(chan struct{})
	resumed := false
	defer func() {
		if !resumed {
			close(resume)
		}
	}()
	peer, payload := pausingResponder(t, size, resume)
	n, err := NewNode(Config{Listen: "127.0.0.1:0", RetryTimeout: time.Minute, TCPOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	pd, _ := n.AllocPD()
	cq, _ := n.CreateCQ(16)
	blk, err := offheap.Alloc(2 * size)
	if err != nil {
		t.Fatal(err)
	}
	defer blk.Close()
	mr, err := pd.RegMR(blk.Bytes(), verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Close()
	q, err := pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxSendSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := verbs.Connect(q, verbs.Endpoint{Addr: peer, QPN: 100}, verbs.Path{}); err != nil {
		t.Fatal(err)
	}
	read := func(id uint64, at int) []verbs.SendWR {
		return []verbs.SendWR{{ID: id, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(mr, at, size)}, RemoteAddr: 1 << 20, RKey: 1}}
	}
	if _, err := q.PostSend(read(1, 0)); err != nil {
		t.Fatal(err)
	}
	// The first half has landed: the reader is in the middle of the
	// response, waiting for the rest. (The MR is off the Go heap, written
	// by the socket read.)
	got := blk.Bytes()[:size]
	for end := time.Now().Add(30 * time.Second); got[size/2-1] == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the first half of the READ response never landed")
		}
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
	resumed = true
	close(resume)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wc := make([]verbs.WC, 1)
	for {
		k, err := cq.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		if k > 0 {
			break
		}
		if err := cq.Wait(ctx); err != nil {
			t.Fatalf("no completion for the READ: %v", err)
		}
	}
	if wc[0].ID != 1 || wc[0].Status != verbs.Success || wc[0].ByteLen != size {
		t.Fatalf("READ completed %+v, want ID 1 SUCCESS of %d bytes", wc[0], size)
	}
	if !bytes.Equal(got, payload) {
		t.Fatal("the READ's bytes differ from the response's")
	}
}
