package client_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/provider/soft"
	"github.com/krcore/krcore/verbs"
)

// The churn test's environment for its client processes.
const (
	// churnEnv sets the churn test's duration ("10m"); default
	// churnDefault.
	churnEnv     = "KRCORE_CHURN"
	churnDefault = 20 * time.Second
	// slotEnv is a checker's or victim's slot of "scratch".
	slotEnv = "KRCORE_CHURN_SLOT"
	// churnConst is the length of "const", whose byte i is constByte(i).
	churnConst = 64 << 10
	// churnSlot is one client's share of "scratch".
	churnSlot = 16 << 10
	// churnSlots is how many slots "scratch" has: checkers take the
	// first, victims the rest.
	churnSlots = 16
	// churnOpTimeout bounds every wait of a churn client: a request that
	// has not completed by then is a hang.
	churnOpTimeout = 20 * time.Second
)

func constByte(i int) byte { return byte(i*7 + i>>8 + 3) }

// churnSetup attaches and makes n VQs connected to node 2 with the regions
// "const" and "scratch", and an MR of size bytes.
func churnSetup(ctx context.Context, sock string, n, size int) (*client.Client, []krcore.VQ, krcore.Region, krcore.Region, krcore.MR, error) {
	c, err := client.Attach(ctx, client.Options{Socket: sock})
	if err != nil {
		return nil, nil, nil, nil, nil, err
	}
	mr, err := c.RegMR(size, verbs.AccessAll)
	var qs []krcore.VQ
	var cst, scratch krcore.Region
	for i := 0; i < n && err == nil; i++ {
		var q krcore.VQ
		if q, err = c.Queue(); err != nil {
			break
		}
		qs = append(qs, q)
		if err = q.Connect(ctx, 2, nil); err == nil && cst == nil {
			if cst, err = q.Region(ctx, "const"); err == nil {
				scratch, err = q.Region(ctx, "scratch")
			}
		}
	}
	if err != nil {
		c.Close()
	}
	return c, qs, cst, scratch, mr, err
}

// stdinClosed is closed when the parent closes the process's stdin: the
// churn is over.
func stdinClosed() <-chan struct{} {
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(done) }()
	return done
}

// checker is a churn client whose every READ and WRITE is verified byte
// for byte: each round it READs pieces of "const" (known bytes) into
// cleared buffers, WRITEs a pattern unique to the round to its slot of
// "scratch" and READs it back, with requests of both kinds in flight
// together on its VQs. A wrong byte, a failed completion or a hang ends it
// with status 1. When the parent closes its stdin it prints "checked READS
// WRITES".
func runChecker(sock string) int {
	slot, _ := strconv.Atoi(os.Getenv(slotEnv))
	ctx := context.Background()
	setup, cancel := context.WithTimeout(ctx, churnOpTimeout)
	c, qs, cst, scratch, mr, err := churnSetup(setup, sock, 2, 64<<10)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "checker:", err)
		return 1
	}
	defer c.Close()
	fmt.Println("ready")
	done := stdinClosed()
	rng := rand.New(rand.NewPCG(uint64(slot), uint64(os.Getpid())))
	buf := mr.Bytes()
	const reads = 6 // READs of const per round, each into its own 4 KiB
	var nReads, nWrites uint64
	out := make([]krcore.Completion, 16)
	for round := uint64(0); ; round++ {
		select {
		case <-done:
			fmt.Printf("checked %d %d\n", nReads, nWrites)
			return 0
		default:
		}
		q := qs[round%2]
		// The pattern to write: unique to this checker and round.
		n := 1 + rng.IntN(churnSlot)
		wbuf, rbuf := buf[32<<10:32<<10+n], buf[48<<10:48<<10+n]
		for i := range wbuf {
			wbuf[i] = byte(round>>uint(8*(i%8))) ^ byte(i) ^ byte(slot*37)
		}
		clear(rbuf)
		reqs := make([]krcore.Request, 0, reads+2)
		type want struct{ off, n, src int }
		wants := make([]want, reads)
		for i := range reads {
			src, n := rng.IntN(churnConst-1), 1+rng.IntN(4096)
			n = min(n, churnConst-src)
			wants[i] = want{i * 4096, n, src}
			clear(buf[i*4096 : i*4096+n])
			reqs = append(reqs, krcore.Request{ID: uint64(i), Op: verbs.OpRead, Local: mr.Range(i*4096, n), Remote: cst.At(uint64(src))})
		}
		// The WRITE, then the READ of what it wrote: a VQ keeps order.
		reqs = append(reqs,
			krcore.Request{ID: reads, Op: verbs.OpWrite, Local: mr.Range(32<<10, n), Remote: scratch.At(uint64(slot * churnSlot))},
			krcore.Request{ID: reads + 1, Op: verbs.OpRead, Local: mr.Range(48<<10, n), Remote: scratch.At(uint64(slot * churnSlot))})
		if err := runAll(ctx, q, reqs, out); err != nil {
			fmt.Fprintf(os.Stderr, "checker %d: round %d: %v\n", slot, round, err)
			return 1
		}
		for _, w := range wants {
			for i, b := range buf[w.off : w.off+w.n] {
				if b != constByte(w.src+i) {
					fmt.Fprintf(os.Stderr, "checker %d: round %d: READ of const [%d,+%d) SUCCESS with byte %d = %#x, want %#x\n",
						slot, round, w.src, w.n, i, b, constByte(w.src+i))
					return 1
				}
			}
		}
		nReads += reads
		for i := range wbuf {
			if rbuf[i] != wbuf[i] {
				fmt.Fprintf(os.Stderr, "checker %d: round %d: WRITE+READ of %d bytes: byte %d = %#x, want %#x\n", slot, round, n, i, rbuf[i], wbuf[i])
				return 1
			}
		}
		nReads++
		nWrites++
	}
}

// runAll pushes reqs and waits for all their completions, which must be
// theirs, in order, and successes, each within churnOpTimeout.
func runAll(ctx context.Context, q krcore.VQ, reqs []krcore.Request, out []krcore.Completion) error {
	ctx, cancel := context.WithTimeout(ctx, churnOpTimeout)
	defer cancel()
	if _, err := q.Push(ctx, true, reqs...); err != nil {
		return fmt.Errorf("push: %w", err)
	}
	for next := 0; next < len(reqs); {
		n, err := q.PopWait(ctx, out)
		if err != nil {
			return fmt.Errorf("request %d of %d: %w", next, len(reqs), err)
		}
		for _, c := range out[:n] {
			if c.ID != reqs[next].ID || c.Err() != nil {
				return fmt.Errorf("completion %+v, want request %d SUCCESS", c, reqs[next].ID)
			}
			next++
		}
	}
	return nil
}

// runChurnVictim keeps READs of "const" and WRITEs to its slot of
// "scratch" in flight on two VQs until it is killed.
func runChurnVictim(sock string) int {
	slot, _ := strconv.Atoi(os.Getenv(slotEnv))
	ctx, cancel := context.WithTimeout(context.Background(), churnOpTimeout)
	defer cancel()
	c, qs, cst, scratch, mr, err := churnSetup(ctx, sock, 2, 64<<10)
	if err != nil {
		fmt.Fprintln(os.Stderr, "victim:", err)
		return 1
	}
	defer c.Close()
	fmt.Println("ready")
	out := make([]krcore.Completion, 16)
	for i := uint64(0); ; i++ {
		q := qs[i%2]
		r := krcore.Request{ID: i, Op: verbs.OpRead, Local: mr.Range(0, 16<<10), Remote: cst.At(i % 48 * 1024)}
		if i%3 == 0 {
			r = krcore.Request{ID: i, Op: verbs.OpWrite, Local: mr.Range(16<<10, churnSlot), Remote: scratch.At(uint64(slot * churnSlot))}
		}
		if _, err := q.Push(context.Background(), true, r); err != nil {
			fmt.Fprintln(os.Stderr, "victim:", err)
			return 1
		}
		if q.Outstanding() > 32 {
			q.PopWait(context.Background(), out)
		}
	}
}

// runChurner makes and drops MRs and VQs mid-traffic until its stdin
// closes: each round an MR and a VQ with 64 READs of 16 KiB in flight, then
// either the MR is deregistered under them and the VQ drained and closed,
// or the VQ is closed under them and the MR deregistered. Its own
// requests may fail; it checks only that nothing hangs. It prints "churned
// MRS VQS".
func runChurner(sock string) int {
	ctx := context.Background()
	setup, cancel := context.WithTimeout(ctx, churnOpTimeout)
	c, qs, cst, _, mr, err := churnSetup(setup, sock, 1, 4096)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "churner:", err)
		return 1
	}
	defer c.Close()
	qs[0].Close()
	c.Deregister(mr)
	fmt.Println("ready")
	done := stdinClosed()
	var mrs, vqs int
	out := make([]krcore.Completion, 64)
	for round := 0; ; round++ {
		select {
		case <-done:
			fmt.Printf("churned %d %d\n", mrs, vqs)
			return 0
		default:
		}
		if err := churnRound(ctx, c, cst, round%2 == 0, out); err != nil {
			fmt.Fprintf(os.Stderr, "churner: round %d: %v\n", round, err)
			return 1
		}
		mrs++
		vqs++
	}
}

// churnRound is one of runChurner's rounds; deregFirst picks the order.
func churnRound(ctx context.Context, c *client.Client, cst krcore.Region, deregFirst bool, out []krcore.Completion) error {
	ctx, cancel := context.WithTimeout(ctx, churnOpTimeout)
	defer cancel()
	mr, err := c.RegMR(64<<10, verbs.AccessAll)
	if err != nil {
		return err
	}
	q, err := c.Queue()
	if err != nil {
		return err
	}
	if err := q.Connect(ctx, 2, nil); err != nil {
		return err
	}
	reqs := make([]krcore.Request, 64)
	for i := range reqs {
		reqs[i] = krcore.Request{ID: uint64(i), Op: verbs.OpRead, Local: mr.Range(i%4*(16<<10), 16<<10), Remote: cst.At(uint64(i % 48 * 1024))}
	}
	if _, err := q.Push(ctx, false, reqs...); err != nil && !errors.Is(err, krcore.ErrNoCredit) {
		return err
	}
	if !deregFirst {
		q.Close()
		return c.Deregister(mr)
	}
	if err := c.Deregister(mr); err != nil {
		return err
	}
	for q.Outstanding() > 0 {
		if _, err := q.PopWait(ctx, out); err != nil {
			return fmt.Errorf("drain after deregister: %w", err)
		}
	}
	return q.Close()
}

// TestChurn runs krcored with client processes that churn beside checkers,
// all on the same shared QPs (one remote node over TCP, DCIs only): victims keep
// READs and WRITEs in flight until they are SIGKILLed, one after another;
// churners deregister MRs and close VQs with requests in flight; checkers
// verify every byte of every READ and WRITE. A wrong byte, a failed
// completion, a hang or a dead daemon fails it. Now and then node 1 holds
// its responses for a few milliseconds (a slow network), so that kills and
// deregistrations find requests in flight. KRCORE_CHURN sets the duration
// (default 20s).
func TestChurn(t *testing.T) {
	dur := churnDefault
	if s := os.Getenv(churnEnv); s != "" {
		var err error
		if dur, err = time.ParseDuration(s); err != nil {
			t.Fatalf("%s=%q: %v", churnEnv, s, err)
		}
	}
	// Over TCP, as between hosts: requests stay in flight long enough
	// for a kill or a deregistration to catch them on the shared DCIs.
	// Nodes 1 and 2 never die here: a patient retry timeout (the
	// cluster's default is 1 s) keeps a request starved of the CPU (under
	// -race beside the other packages, load ~22) from marking node 2 dead,
	// which failed every client's requests to it.
	e := startCluster(t, cluster.Config{Nodes: 2, Runtime: core.Config{RCPeers: -1}, Soft: soft.Config{Listen: "127.0.0.1:0", RetryTimeout: 10 * time.Second}})
	node2 := e.c.Node(2)
	cst, err := node2.RegMR(churnConst, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	for i := range cst.Bytes() {
		cst.Bytes()[i] = constByte(i)
	}
	scratch, err := node2.RegMR(churnSlots*churnSlot, verbs.AccessAll)
	if err == nil {
		err = node2.Export("const", cst, 0, churnConst, verbs.AccessRemoteRead)
	}
	if err == nil {
		err = node2.Export("scratch", scratch, 0, churnSlots*churnSlot, verbs.AccessRemoteRead|verbs.AccessRemoteWrite)
	}
	if err != nil {
		t.Fatal(err)
	}
	const checkers, churners = 3, 3
	type talker struct {
		name  string
		in    io.WriteCloser
		lines *bufio.Scanner
	}
	var talkers []talker
	for i := range checkers {
		_, in, lines := startTalker(t, e.sock, modeEnv+"=checker", slotEnv+"="+strconv.Itoa(i))
		talkers = append(talkers, talker{fmt.Sprintf("checker %d", i), in.(io.WriteCloser), lines})
	}
	for i := range churners {
		_, in, lines := startTalker(t, e.sock, modeEnv+"=churner")
		talkers = append(talkers, talker{fmt.Sprintf("churner %d", i), in.(io.WriteCloser), lines})
	}
	// A slow network now and then: node 1 holds the responses it gets
	// for up to 30 ms, so kills and deregistrations catch requests in
	// flight behind the checkers' on the shared DCIs.
	stopSlow, slowDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(slowDone)
		rng := rand.New(rand.NewPCG(1, 2))
		for {
			_, release := e.c.Devices[0].HoldResponses()
			hold := time.NewTimer(time.Duration(rng.IntN(30)) * time.Millisecond)
			select {
			case <-hold.C:
			case <-stopSlow:
			}
			release()
			pause := time.NewTimer(time.Duration(10+rng.IntN(60)) * time.Millisecond)
			select {
			case <-pause.C:
			case <-stopSlow:
				return
			}
		}
	}()
	defer func() {
		select {
		case <-stopSlow:
		default:
			close(stopSlow)
		}
		<-slowDone
	}()
	// Victims, one after another: started, let run until the daemon has
	// taken some of their requests, killed.
	kills := 0
	t0 := time.Now()
	for time.Since(t0) < dur && !t.Failed() {
		slot := checkers + kills%(churnSlots-checkers)
		killMidTraffic(t, e, startChild(t, e.sock, modeEnv+"=churnvictim", slotEnv+"="+strconv.Itoa(slot)), "victim")
		kills++
	}
	close(stopSlow)
	<-slowDone
	var reads, writes, mrs, vqs uint64
	for _, tk := range talkers {
		tk.in.Close()
		if !tk.lines.Scan() {
			t.Errorf("%s: no figures (it failed: see its stderr)", tk.name)
			continue
		}
		f := strings.Fields(tk.lines.Text())
		if len(f) != 3 {
			t.Errorf("%s: %q", tk.name, tk.lines.Text())
			continue
		}
		a, _ := strconv.ParseUint(f[1], 10, 64)
		b, _ := strconv.ParseUint(f[2], 10, 64)
		if f[0] == "checked" {
			reads, writes = reads+a, writes+b
		} else {
			mrs, vqs = mrs+a, vqs+b
		}
	}
	t.Logf("churn for %v: %d checkers, %d churners, %d victims killed; %d READs and %d WRITEs checked byte for byte, 0 wrong; %d MRs and %d VQs dropped mid-traffic",
		time.Since(t0).Round(time.Second), checkers, churners, kills, reads, writes, mrs, vqs)
	if reads == 0 || kills == 0 || mrs == 0 {
		t.Errorf("no churn: %d READs checked, %d kills, %d MRs dropped", reads, kills, mrs)
	}
}
