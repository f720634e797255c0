package soft_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// TestShmChosen: nodes in different fabrics of one host reach each other
// by shared memory unless told to use TCP (Config.TCPOnly on either side,
// or soft.EnvLink=tcp); a node whose peer has no shared-memory listener
// uses TCP and says why.
func TestShmChosen(t *testing.T) {
	cfg := soft.Config{Listen: "127.0.0.1:0", RetryTimeout: time.Second}
	tcp := cfg
	tcp.TCPOnly = true
	for _, c := range []struct {
		name   string
		a, b   soft.Config
		env    string
		want   string
		reason bool
	}{
		{"auto", cfg, cfg, "", "shm", false},
		{"tcp-only", tcp, tcp, "", "tcp", false},
		{"peer tcp-only", cfg, tcp, "", "tcp", true},
		{"env", cfg, cfg, "tcp", "tcp", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.env != "" {
				t.Setenv(soft.EnvLink, c.env)
			}
			a, err := soft.NewNode(c.a)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			b, err := soft.NewNode(c.b)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			x, y := connectPairPath(t, a, b, 4096, patientPath)
			copy(y.mr.Bytes(), "shm-link")
			post(t, x.qp, read8(x, y, 1))
			if wc := waitWC(t, x.cq); wc.Status != verbs.Success || string(x.mr.Bytes()[:8]) != "shm-link" {
				t.Fatalf("READ: %+v, read %q", wc, x.mr.Bytes()[:8])
			}
			kind, why := a.PeerLink(b.Addr())
			if kind != c.want || (why != nil) != c.reason {
				t.Fatalf("link %q (shm not used because: %v), want %q", kind, why, c.want)
			}
		})
	}
}

// childEnv tells a test binary started by startChild which part to play.
const childEnv = "KRCORE_SOFT_SHM_CHILD"

// TestShmChildProcess is the child side of the cross-process tests; it
// does nothing unless started by one.
func TestShmChildProcess(t *testing.T) {
	mode := os.Getenv(childEnv)
	if mode == "" {
		t.Skip("run by TestShmPeerKilled and TestShmManyLinks")
	}
	in := bufio.NewScanner(os.Stdin)
	switch mode {
	case "peer":
		childPeer(t, in)
	case "many":
		childMany(t, in)
	case "placer":
		childPlacer(t, in)
	}
	os.Exit(0)
}

// startChild starts this test binary as a child playing mode, returning a
// reader of its stdout lines and a writer to its stdin.
func startChild(t *testing.T, mode string) (*exec.Cmd, *bufio.Scanner, *os.File) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestShmChildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+mode)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = inR
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	inR.Close()
	t.Cleanup(func() {
		inW.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd, bufio.NewScanner(out), inW
}

// line reads the child's next line, failing the test if there is none.
func line(t *testing.T, s *bufio.Scanner) []string {
	t.Helper()
	if !s.Scan() {
		t.Fatalf("child said nothing: %v", s.Err())
	}
	return strings.Fields(s.Text())
}

func atou(t testing.TB, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Layout of the survivor's registered memory in TestShmPeerKilled.
const (
	killZone  = 256 << 10 // each zone's size
	readZone  = 0         // READ responses land here
	writeZone = killZone  // the child WRITEs here
	guardZone = 2 * killZone
	recvZone  = 4 * killZone // the child's SENDs, larger than a ring, land here
	sendSize  = 4 * killZone
	killMR    = recvZone + sendSize
	recvID    = 1 << 32 // receive WR IDs
)

// childPeer serves a QP the parent connects to and WRITEs and SENDs into
// the parent's memory as fast as it can until killed.
func childPeer(t *testing.T, in *bufio.Scanner) {
	n, err := soft.NewNode(soft.Config{Listen: "127.0.0.1:0", RetryTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s := newSide(t, n, killMR)
	for i := range s.mr.Bytes() {
		s.mr.Bytes()[i] = byte(i)
	}
	ep := s.qp.Endpoint()
	fmt.Printf("%s %d %d %d %d\n", ep.Addr, ep.QPN, ep.PSN, s.mr.Addr(), s.mr.RKey())
	raddr, rkey := joinParent(t, in, s)
	wr := verbs.SendWR{Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(s.mr, 0, killZone)}, RemoteAddr: raddr + writeZone, RKey: rkey}
	send := verbs.SendWR{Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(s.mr, 0, sendSize)}}
	var wc [8]verbs.WC
	for out, i := 0, 0; ; {
		for ; out < 8; out, i = out+1, i+1 {
			w := wr
			if i%2 == 1 {
				w = send
			}
			if _, err := s.qp.PostSend([]verbs.SendWR{w}); err != nil {
				t.Fatal(err)
			}
		}
		k, err := s.cq.Poll(wc[:])
		if err != nil {
			t.Fatal(err)
		}
		out -= k
		if k == 0 {
			s.cq.Wait(context.Background())
		}
	}
}

// TestShmPeerKilled: a peer process killed in the middle of transfers in
// both directions is a link failure for the survivor, as a cable pull is:
// its requests in flight fail with RETRY_EXC_ERR (and the rest flush)
// within the retry budget, nothing hangs, no receive completes with an
// error, its memory outside what the dead peer was writing is untouched,
// and the node goes on working.
func TestShmPeerKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	cmd, out, in := startChild(t, "peer")
	f := line(t, out)
	childEP := verbs.Endpoint{Addr: f[0], QPN: uint32(atou(t, f[1])), PSN: uint32(atou(t, f[2]))}
	craddr, crkey := atou(t, f[3]), uint32(atou(t, f[4]))

	a, err := soft.NewNode(soft.Config{Listen: "127.0.0.1:0", RetryTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	x := newSide(t, a, killMR)
	guard := x.mr.Bytes()[guardZone:recvZone]
	for i := range guard {
		guard[i] = 0xa5
	}
	// Timeout*(RetryCount+1): the first try and two retries. Before the
	// kill no request may time out: at nice 19 at load 26-30 a budget of
	// 1.5 s failed a READ before the kill in 1 of 5 -race runs, the child
	// (or this process) not having run.
	const budget = 6 * time.Second
	if err := verbs.Connect(x.qp, childEP, verbs.Path{Timeout: budget / 3, RetryCount: 2}); err != nil {
		t.Fatal(err)
	}
	recv := verbs.RecvWR{ID: recvID, SGL: []verbs.SGE{verbs.SGEOf(x.mr, recvZone, sendSize)}}
	for range 16 {
		if _, err := x.qp.PostRecv([]verbs.RecvWR{recv}); err != nil {
			t.Fatal(err)
		}
	}
	ep := x.qp.Endpoint()
	fmt.Fprintf(in, "%s %d %d %d %d\n", ep.Addr, ep.QPN, ep.PSN, x.mr.Addr(), x.mr.RKey())
	if f := line(t, out); len(f) != 1 || f[0] != "ready" {
		t.Fatalf("child: %v", f)
	}
	rd := verbs.SendWR{Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(x.mr, readZone, killZone)}, RemoteAddr: craddr, RKey: crkey}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wc [16]verbs.WC
	var killedAt time.Time
	cpu := newOffCPU(t)
	var first verbs.WC
	sends := 0
	done, outstanding := 0, 0
	for first.Status == verbs.Success {
		for ; outstanding < 8 && (killedAt.IsZero() || outstanding == 0); outstanding++ {
			rd.ID = uint64(done + outstanding)
			if _, err := x.qp.PostSend([]verbs.SendWR{rd}); err != nil {
				t.Fatal(err)
			}
		}
		k, err := x.cq.Poll(wc[:])
		if err != nil {
			t.Fatal(err)
		}
		reads := 0
		for _, c := range wc[:k] {
			if c.ID >= recvID {
				// A SEND the kill cut short is lost, as on a wire.
				if c.Status != verbs.Success && c.Status != verbs.WRFlushErr {
					t.Fatalf("receive completed with %v", c.Status)
				}
				if c.Status == verbs.Success {
					sends++
					if _, err := x.qp.PostRecv([]verbs.RecvWR{recv}); err != nil {
						t.Fatal(err)
					}
				}
				continue
			}
			reads++
			if c.Status != verbs.Success && first.Status == verbs.Success {
				first = c
			}
		}
		done, outstanding = done+reads, outstanding-reads
		if done >= 64 && killedAt.IsZero() {
			if kind, why := a.PeerLink(childEP.Addr); kind != "shm" {
				t.Fatalf("link to the child: %q (%v), want shm", kind, why)
			}
			cmd.Process.Kill()
			killedAt = time.Now()
		}
		if k == 0 {
			if err := x.cq.Wait(ctx); err != nil {
				t.Fatalf("after %d READs, %d outstanding: %v", done, outstanding, err)
			}
		}
	}
	if killedAt.IsZero() {
		kind, why := a.PeerLink(childEP.Addr)
		cmd.Process.Kill()
		for out.Scan() {
			t.Log("child:", out.Text())
		}
		t.Fatalf("READ %d failed before the peer was killed: %v (link %q, %v)", first.ID, first.Status, kind, why)
	}
	// Within the budget of the time this process ran: one that did not
	// run cannot fail anything promptly.
	took, wall := cpu.running(killedAt, time.Now())
	if !errors.Is(first.Err(), verbs.RetryExcErr) {
		t.Fatalf("first failed READ (%d done before): %v, want RETRY_EXC_ERR", done, first.Status)
	}
	if took > budget+2*time.Second {
		t.Fatalf("READs failed %v after the kill (%v of it running), budget %v", wall, took, budget)
	}
	for i, b := range guard {
		if b != 0xa5 {
			t.Fatalf("guard byte %d is %#x after the peer died", i, b)
		}
	}
	// The survivor still works: a new peer process on shared memory.
	b, err := soft.NewNode(soft.Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	p, q := connectPair(t, a, b, 4096)
	post(t, p.qp, read8(p, q, 1))
	if wc := waitWC(t, p.cq); wc.Status != verbs.Success {
		t.Fatalf("READ after the peer died: %+v", wc)
	}
	t.Logf("%d READs of %d KiB and %d SENDs of %d KiB, then the peer was killed: RETRY_EXC_ERR after %v (%v running)", done, killZone>>10, sends, sendSize>>10, wall.Round(time.Millisecond), took.Round(time.Millisecond))
}

// joinParent reads the parent's endpoint and the address and key of its
// MR from in, connects s's QP to it, and tells the parent it is ready.
func joinParent(t *testing.T, in *bufio.Scanner, s *side) (raddr uint64, rkey uint32) {
	if !in.Scan() {
		t.Fatal("no parent")
	}
	f := strings.Fields(in.Text())
	peer := verbs.Endpoint{Addr: f[0], QPN: uint32(atou(t, f[1])), PSN: uint32(atou(t, f[2]))}
	raddr, rkey = atou(t, f[3]), uint32(atou(t, f[4]))
	// Patient: a parent that did not run for 2 s would fail the child's
	// requests, and with them the QP the parent's requests go to.
	if err := verbs.Connect(s.qp, peer, verbs.Path{Timeout: 10 * time.Second, RetryCount: 1}); err != nil {
		t.Fatal(err)
	}
	fmt.Println("ready")
	return raddr, rkey
}

// childMany starts as many nodes as the parent asks for and links each to
// the parent's node; then, for each line the parent sends, it answers how
// many of them reach the parent over shared memory, and the first other
// kind of link with why; it runs until killed.
func childMany(t *testing.T, in *bufio.Scanner) {
	if !in.Scan() {
		t.Fatal("no parent")
	}
	f := strings.Fields(in.Text())
	addr, links := f[0], int(atou(t, f[1]))
	var cqs []verbs.CQ
	var nodes []*soft.Node
	for i := range links {
		n, err := soft.NewNode(soft.Config{RetryTimeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
		pd, _ := n.AllocPD()
		cq, _ := n.CreateCQ(4)
		q, err := pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: 64}})
		if err != nil {
			t.Fatal(err)
		}
		// Nobody answers QP 1: the request only brings the link up.
		if err := verbs.Connect(q, verbs.Endpoint{Addr: addr, QPN: 1}, verbs.Path{}); err != nil {
			t.Fatal(err)
		}
		if _, err := q.PostSend([]verbs.SendWR{{ID: uint64(i), Op: verbs.OpWrite, RKey: 1}}); err != nil {
			t.Fatal(err)
		}
		cqs = append(cqs, cq)
	}
	fmt.Println("posted")
	runtime.KeepAlive(cqs)
	for in.Scan() {
		shm, other := 0, "none"
		for _, n := range nodes {
			if kind, why := n.PeerLink(addr); kind == "shm" {
				shm++
			} else {
				other = fmt.Sprintf("%q (%v)", kind, why)
			}
		}
		fmt.Printf("%d %s\n", shm, other)
	}
}

// TestShmManyLinks: a thousand links between two processes cost the heap
// little beside their rings, which live in the memfds.
func TestShmManyLinks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	const links = 1000
	// As patient as the child: starved (the package at nice 19 beside the
	// full -race suite), a child node may write its hello after the
	// default 2 s this node waits for it from the accept; this node has
	// closed the connection then, and that child node reaches it over TCP
	// instead (whose links each hold a 256 KiB read buffer on the heap).
	// This test measures the shared-memory links'.
	a, err := soft.NewNode(soft.Config{Listen: "127.0.0.1:0", DialTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, out, in := startChild(t, "many")
	fmt.Fprintf(in, "%s %d\n", a.Addr(), links)
	if f := line(t, out); len(f) != 1 || f[0] != "posted" {
		t.Fatalf("child: %v", f)
	}
	// Starved, a thousand set-ups take long; the deadline only bounds a
	// hang.
	deadline := time.Now().Add(5 * time.Minute)
	for a.Stats().Links < links {
		if time.Now().After(deadline) {
			t.Fatalf("%d links up, want %d", a.Stats().Links, links)
		}
		time.Sleep(10 * time.Millisecond)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	rings := int64(links) * soft.ShmSegmentSize
	t.Logf("%d links: heap +%d KiB (%d B a link), rings %d MiB off the heap", links, heap>>10, heap/links, rings>>20)
	allShm(t, out, in, links, deadline)
	if heap > links*16<<10 {
		t.Fatalf("%d links grew the heap by %d KiB, more than 16 KiB a link", links, heap>>10)
	}
}

// allShm asks the many child until all its links reach this node over
// shared memory. This node counts a link up when it adopts the child's
// hello, before its answer reaches the child node, which until then has no
// link to report and no why ("" (<nil>)): it asks again while that is all,
// and fails on any other kind or at the deadline.
func allShm(t *testing.T, out *bufio.Scanner, in *os.File, links int, deadline time.Time) {
	t.Helper()
	asked := 0
	for {
		fmt.Fprintln(in, "kinds")
		f := line(t, out)
		if len(f) >= 1 && f[0] == strconv.Itoa(links) {
			break
		}
		if len(f) != 3 || f[1] != `""` || f[2] != "(<nil>)" || time.Now().After(deadline) {
			t.Fatalf("child: %v: want all %d links over shared memory (count, another's kind and why)", f, links)
		}
		if asked++; asked == 1 {
			t.Logf("child: %v: links still being set up", f)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if asked > 0 {
		t.Logf("child: all %d links over shared memory after %d answers of fewer", links, asked)
	}
}

// TestShmLargeStreams: frames far larger than a ring stream through it in
// both directions at once (each side's reader also writes the responses
// to the other's requests, so neither may wait for room).
func TestShmLargeStreams(t *testing.T) {
	a, b := listenPair(t, soft.Config{Listen: "127.0.0.1:0", RetryTimeout: 3 * time.Second})
	const size = 3 << 20
	x, y := newSide(t, a, 2*size), newSide(t, b, 2*size)
	p := verbs.Path{Timeout: 2 * time.Second, RetryCount: 3}
	if err := verbs.Connect(x.qp, y.qp.Endpoint(), p); err != nil {
		t.Fatal(err)
	}
	if err := verbs.Connect(y.qp, x.qp.Endpoint(), p); err != nil {
		t.Fatal(err)
	}
	for i := range size {
		y.mr.Bytes()[i] = byte(i * 7)
		x.mr.Bytes()[size+i] = byte(i * 13)
	}
	post(t, x.qp, verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(x.mr, 0, size)}, RemoteAddr: y.mr.Addr(), RKey: y.mr.RKey()},
		verbs.SendWR{ID: 2, Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(x.mr, size, size)}, RemoteAddr: y.mr.Addr() + size, RKey: y.mr.RKey()})
	post(t, y.qp, verbs.SendWR{ID: 3, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{verbs.SGEOf(y.mr, size, size)}, RemoteAddr: x.mr.Addr() + size, RKey: x.mr.RKey()})
	for _, s := range []*side{x, x, y} {
		if wc := waitWC(t, s.cq); wc.Status != verbs.Success {
			t.Fatalf("%+v", wc)
		}
	}
	if !bytes.Equal(x.mr.Bytes()[:size], y.mr.Bytes()[:size]) || !bytes.Equal(x.mr.Bytes()[size:], y.mr.Bytes()[size:]) {
		t.Fatal("data differs after streaming through the rings")
	}
	if kind, _ := a.PeerLink(b.Addr()); kind != "shm" {
		t.Fatalf("link %q, want shm", kind)
	}
}

// TestCloseSilentHello: a node closes at once while a connector on its
// TCP or shared-memory listener says nothing, instead of waiting out the
// hello's deadline.
func TestCloseSilentHello(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			n, err := soft.NewNode(soft.Config{Listen: "127.0.0.1:0", DialTimeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			addr := n.Addr()
			if network == "unix" {
				addr = "@krcore-soft/" + addr
			}
			c, err := net.Dial(network, addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			time.Sleep(50 * time.Millisecond) // let the node accept it
			start := time.Now()
			n.Close()
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("Close took %v with a silent %s connector", d, network)
			}
		})
	}
}

// BenchmarkShmRead8 times an 8 B READ, posted and waited for, on a
// shared-memory link between two nodes of this process (both sides'
// schedulers are this process's: krbench demo measures across processes).
func BenchmarkShmRead8(b *testing.B) { benchShm8(b, read8) }

// BenchmarkShmWrite8 times an 8 B WRITE as BenchmarkShmRead8 times a READ:
// the responder reads its payload from the link.
func BenchmarkShmWrite8(b *testing.B) {
	benchShm8(b, func(x, y *side, id uint64) verbs.SendWR {
		wr := read8(x, y, id)
		wr.Op = verbs.OpWrite
		return wr
	})
}

// benchShm8 times the requests wr makes, one at a time, on a
// shared-memory link between two nodes of this process.
func benchShm8(b *testing.B, wr func(x, y *side, id uint64) verbs.SendWR) {
	cfg := soft.Config{Listen: "127.0.0.1:0", RetryTimeout: time.Second}
	x0, err := soft.NewNode(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer x0.Close()
	y0, err := soft.NewNode(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer y0.Close()
	x, y := connectPair(b, x0, y0, 4096)
	post(b, x.qp, wr(x, y, 1))
	waitWC(b, x.cq)
	if kind, why := x0.PeerLink(y0.Addr()); kind != "shm" {
		b.Fatalf("link %q, not shm: %v", kind, why)
	}
	lat := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		post(b, x.qp, wr(x, y, uint64(i)))
		if wc := waitWC(b, x.cq); wc.Status != verbs.Success {
			b.Fatal(wc)
		}
		lat[i] = time.Since(start)
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*9/10].Nanoseconds()), "p90-ns")
}

// TestShmNameFreedWithPort: a node's shared-memory name is free by the time
// its TCP port is, so the next node to listen on that port (one restarted
// on its address, or in any process a node whose listen drew the port)
// gets the name too, and is reached by shared memory, not over TCP.
func TestShmNameFreedWithPort(t *testing.T) {
	for i := range 30 {
		a, err := soft.NewNode(soft.Config{Listen: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		addr := a.Addr()
		type listened struct {
			n   *soft.Node
			err error
		}
		got := make(chan listened, 1)
		go func() {
			// Takes the port as soon as a's Close frees it; gives up if
			// another process keeps it (neither node nor error).
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				b, err := soft.NewNode(soft.Config{Listen: addr})
				if err == nil || !errors.Is(err, soft.ErrAddrInUse) {
					got <- listened{b, err}
					return
				}
				runtime.Gosched()
			}
			got <- listened{}
		}()
		a.Close()
		r := <-got
		if r.err != nil {
			t.Fatal(r.err)
		}
		b := r.n
		if b == nil {
			continue
		}
		why := soft.ShmListenErr(b)
		b.Close()
		if why != nil {
			t.Fatalf("round %d: the node listening on %s after the closed one has no shared-memory listener: %v", i, addr, why)
		}
	}
}
