package meta

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore/offheap"
	"github.com/krcore/krcore/verbs"
)

// rawUD is a bare UD QP for sending the server arbitrary datagrams.
type rawUD struct {
	t     testing.TB
	qp    verbs.QP
	cq    verbs.CQ
	mr    verbs.MR
	ah    verbs.AH
	srv   Info
	early []verbs.WC // completions polled while waiting for another
}

func newRawUD(t testing.TB, dev verbs.Device, srv Info) *rawUD {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	u := &rawUD{t: t, srv: srv}
	pd, err := dev.AllocPD()
	must(err)
	u.cq, err = dev.CreateCQ(64)
	must(err)
	u.qp, err = pd.CreateQP(verbs.QPInit{Type: verbs.UD, SendCQ: u.cq, RecvCQ: u.cq, SignalAll: true,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	must(err)
	must(verbs.Ready(u.qp, verbs.Path{QKey: srv.QKey}))
	blk, err := offheap.Alloc(16 << 10)
	must(err)
	u.mr, err = pd.RegMR(blk.Bytes(), verbs.AccessLocalWrite)
	must(err)
	u.ah, err = pd.CreateAH(verbs.AHAttr{Dest: srv.endpoint()})
	must(err)
	_, err = u.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{verbs.SGEOf(u.mr, 8<<10, 1024)}}})
	must(err)
	t.Cleanup(func() {
		u.qp.Close()
		u.ah.Close()
		u.mr.Close()
		u.cq.Close()
		pd.Close()
		blk.Close()
	})
	return u
}

// send sends b as one datagram and waits for its send completion.
func (u *rawUD) send(b []byte) {
	u.t.Helper()
	copy(u.mr.Bytes(), b)
	wr := verbs.SendWR{ID: 2, Op: verbs.OpSend, SGL: []verbs.SGE{verbs.SGEOf(u.mr, 0, len(b))}, AH: u.ah, RemoteQPN: u.srv.QPN, QKey: u.srv.QKey}
	if _, err := u.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		u.t.Fatal(err)
	}
	if wc := u.wait(2); wc.Status != verbs.Success {
		u.t.Fatalf("raw send: %+v", wc)
	}
}

// wait returns the completion of work request id. A reply can complete
// before the send that caused it, so others are kept for later.
func (u *rawUD) wait(id uint64) verbs.WC {
	u.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wc [1]verbs.WC
	for {
		for i, w := range u.early {
			if w.ID == id {
				u.early = append(u.early[:i], u.early[i+1:]...)
				return w
			}
		}
		n, err := u.cq.Poll(wc[:])
		switch {
		case err != nil:
			u.t.Fatal(err)
		case n == 1:
			u.early = append(u.early, wc[0])
		default:
			if err := u.cq.Wait(ctx); err != nil {
				u.t.Fatalf("waiting for completion %d: %v", id, err)
			}
		}
	}
}

// TestServerIgnoresGarbage: datagrams that are not requests (random bytes,
// truncated or corrupted requests, oversized ones) are counted and dropped,
// and the server keeps serving.
func TestServerIgnoresGarbage(t *testing.T) {
	nodes := memNodes(t, 2)
	ctx := testCtx(t)
	srv := startServer(t, nodes[0], ServerConfig{})
	raw := newRawUD(t, nodes[1], srv.Info())
	good := sampleRequest(opRegister)
	good.reply = raw.qp.Endpoint()
	enc := good.encode(nil)
	rng := rand.New(rand.NewPCG(1, 2))
	junk := [][]byte{{}, {1}, enc[:reqFixedLen], append(bytes.Clone(enc), 7), make([]byte, 2000)}
	corrupt := bytes.Clone(enc)
	corrupt[reqHeaderLen+9] ^= 0x40 // the record's CRC no longer matches
	junk = append(junk, corrupt)
	for range 50 {
		b := make([]byte, rng.IntN(600))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		junk = append(junk, b)
	}
	for _, b := range junk {
		raw.send(b)
	}
	c := startClient(t, nodes[1], []Info{srv.Info()}, fastClient)
	if err := c.Register(ctx, recordOf(nodes[1], 1), 0); err != nil {
		t.Fatalf("server stopped serving after garbage: %v", err)
	}
	if st := srv.Stats(); st.Dropped != uint64(len(junk)) || st.Requests != 1 {
		t.Fatalf("stats %+v: want %d dropped, 1 request", st, len(junk))
	}
}

// TestServerAnswersInvalid: a well-framed request that makes no sense gets
// an "invalid" reply rather than silence, so its sender fails fast.
func TestServerAnswersInvalid(t *testing.T) {
	nodes := memNodes(t, 2)
	srv := startServer(t, nodes[0], ServerConfig{})
	raw := newRawUD(t, nodes[1], srv.Info())
	req := sampleRequest(opRenew)
	req.node = 0
	req.reply = raw.qp.Endpoint()
	raw.send(req.encode(nil))
	wc := raw.wait(1)
	if wc.Status != verbs.Success || wc.ByteLen != grhLen+replyLen {
		t.Fatalf("reply completion %+v", wc)
	}
	rep, err := decodeReply(raw.mr.Bytes()[8<<10+grhLen : 8<<10+grhLen+replyLen])
	if err != nil || rep.status != stInvalid || rep.id != req.id || rep.op != opRenew {
		t.Fatalf("reply %+v, %v", rep, err)
	}
}

// TestServerSurvivesUnreachableClient: a request whose reply address
// nobody answers costs the server nothing: the reply is lost on the wire
// (UD never waits for its destination), and the server goes on serving at
// once, on the same QP.
func TestServerSurvivesUnreachableClient(t *testing.T) {
	nodes := memNodes(t, 2)
	ctx := testCtx(t)
	srv := startServer(t, nodes[0], ServerConfig{ReplyTimeout: 20 * time.Millisecond})
	raw := newRawUD(t, nodes[1], srv.Info())
	req := sampleRequest(opHello)
	req.reply = verbs.Endpoint{Addr: "mem:nobody", QPN: 77}
	raw.send(req.encode(nil))
	eventually(t, 5*time.Second, "the request served", func() bool { return srv.Stats().Requests == 1 })
	c := startClient(t, nodes[1], []Info{srv.Info()}, fastClient)
	if err := c.Register(ctx, recordOf(nodes[1], 1), 0); err != nil {
		t.Fatalf("after the reset: %v", err)
	}
	if srv.Info().QPN != srv.ud.Num() {
		t.Fatal("the reset changed the server's QPN")
	}
}

// TestRetriedRequestAppliedOnce: a retry (same request id) of a
// Deregister is answered with the first reply, not "not found", and a
// retried Register does not rewrite the slot.
func TestRetriedRequestAppliedOnce(t *testing.T) {
	nodes := memNodes(t, 2)
	ctx := testCtx(t)
	srv := startServer(t, nodes[0], ServerConfig{})
	c := startClient(t, nodes[1], []Info{srv.Info()}, fastClient)
	sc := c.conns[0]
	reg := request{op: opRegister, id: 1000, node: 5, rec: recordOf(nodes[1], 5)}
	var versions []uint64
	for range 2 {
		rep, err := sc.exchange(ctx, &reg)
		if err != nil || rep.status != stOK {
			t.Fatalf("register: %+v, %v", rep, err)
		}
		versions = append(versions, rep.version)
	}
	dereg := request{op: opDeregister, id: 1001, node: 5}
	for i := range 2 {
		rep, err := sc.exchange(ctx, &dereg)
		if err != nil || rep.status != stOK {
			t.Fatalf("deregister copy %d: %+v, %v", i, rep, err)
		}
	}
	if st := srv.Stats(); st.Duplicates != 2 || versions[0] != versions[1] {
		t.Fatalf("stats %+v, versions %v: want 2 duplicates and one version", st, versions)
	}
	// A new request id is a new request.
	dereg.id++
	if rep, err := sc.exchange(ctx, &dereg); err != nil || rep.status != stNotFound {
		t.Fatalf("new deregister: %+v, %v", rep, err)
	}
}

// tableSlotOf finds the table memory of the slot holding node.
func tableSlotOf(t testing.TB, srv *Server, node uint64) []byte {
	t.Helper()
	b := bucketOf(node, srv.cfg.Buckets)
	mem := srv.tblMem.Bytes()
	for i := b * srv.cfg.Slots; i < (b+1)*srv.cfg.Slots; i++ {
		if r, err := decodeSlot(mem[i*SlotSize:]); err == nil && r.Node == node {
			return mem[i*SlotSize : (i+1)*SlotSize]
		}
	}
	t.Fatalf("node %d not in the table", node)
	return nil
}

// TestTornReadRace: a writer rewrites a record's slot as fast as it can
// while the client fetches it. Every fetch must return one of the two
// versions exactly, never a mix; torn READs are retried.
func TestTornReadRace(t *testing.T) {
	nodes := memNodes(t, 2)
	ctx := testCtx(t)
	srv := startServer(t, nodes[0], ServerConfig{})
	c := startClient(t, nodes[1], []Info{srv.Info()}, ClientConfig{})
	a := recordOf(nodes[1], 9)
	if err := c.Register(ctx, a, 0); err != nil {
		t.Fatal(err)
	}
	slot := tableSlotOf(t, srv, 9)
	// The test writes the slot itself, standing in for the server loop
	// (which is idle: no requests are sent meanwhile).
	b := a
	b.DCTNum, b.DCKey, b.Addr = ^a.DCTNum, ^a.DCKey, "mem:other-node-with-a-longer-name"
	var encA, encB [SlotSize]byte
	encodeSlot(encA[:], 1<<40, a)
	encodeSlot(encB[:], 1<<40+1, b)
	copy(slot, encA[:]) // before the first fetch, whenever the writer starts
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		// Yielding after each write leaves intact windows, as a real
		// server (one write per request) does; without them no READ
		// could succeed and ErrTorn would be the right answer.
		for {
			select {
			case <-stop:
				return
			default:
			}
			copy(slot, encA[:])
			runtime.Gosched()
			copy(slot, encB[:])
			runtime.Gosched()
		}
	})
	want := map[Record]bool{withVersion(a, 1<<40): true, withVersion(b, 1<<40+1): true}
	for range 3000 {
		r, err := c.Fetch(ctx, 9)
		if err != nil || !want[r] {
			close(stop)
			wg.Wait()
			t.Fatalf("fetch during rewrites: %+v, %v", r, err)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("3000 fetches, %d torn READs detected and retried", c.Stats().TornReads)
}

// TestTornForever: a slot that never reads intact fails with ErrTorn once
// TornWait has passed, not at once and not never.
func TestTornForever(t *testing.T) {
	nodes := memNodes(t, 2)
	ctx := testCtx(t)
	srv := startServer(t, nodes[0], ServerConfig{})
	c := startClient(t, nodes[1], []Info{srv.Info()}, ClientConfig{TornWait: 50 * time.Millisecond})
	if err := c.Register(ctx, recordOf(nodes[1], 4), 0); err != nil {
		t.Fatal(err)
	}
	slot := tableSlotOf(t, srv, 4)
	slot[offDCKey] ^= 1
	t0 := time.Now()
	_, err := c.Fetch(ctx, 4)
	if took := time.Since(t0); !errors.Is(err, ErrTorn) || took < 50*time.Millisecond || took > 5*time.Second {
		t.Fatalf("Fetch of a corrupt slot: %v after %v and %d torn READs, want ErrTorn after about 50ms", err, took, c.Stats().TornReads)
	}
	t.Log(err)
	slot[offDCKey] ^= 1
	if _, err := c.Fetch(ctx, 4); err != nil {
		t.Fatal(err)
	}
}

// metaGoroutines counts live goroutines started by creator (a function of
// this package, e.g. "NewServer"). It goes by the "created by" line: a
// goroutine not yet scheduled shows only a go statement's wrapper frame,
// and one returning from its function still shows that function.
func metaGoroutines(creator string) int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "created by github.com/krcore/krcore/meta."+creator+" ")
}

// TestNoGoroutineLeak: a server and a registering client start goroutines
// (the server loop, a renewal per registration) and stop every one:
// Deregister stops its renewal, Close the rest.
func TestNoGoroutineLeak(t *testing.T) {
	nodes := memNodes(t, 2)
	ctx := testCtx(t)
	srv, err := NewServer(nodes[0], ServerConfig{MinLease: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(nodes[1], []Info{srv.Info()}, fastClient)
	if err != nil {
		t.Fatal(err)
	}
	for n := uint64(1); n <= 3; n++ {
		if err := c.Register(ctx, recordOf(nodes[1], n), 30*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Deregister(ctx, 2); err != nil {
		t.Fatal(err)
	}
	// A stopped goroutine may still be returning (Deregister waits for its
	// renewal to finish, not to leave the stack), so counts settle briefly.
	counts := func() (int, int) {
		return metaGoroutines("NewServer"), metaGoroutines("(*Client).startRenewing")
	}
	eventually(t, 5*time.Second, "1 server loop and 2 renewals", func() bool {
		s, r := counts()
		return s == 1 && r == 2
	})
	c.Close()
	srv.Close()
	eventually(t, 5*time.Second, "no meta goroutine after Close", func() bool {
		s, r := counts()
		return s+r == 0
	})
}
