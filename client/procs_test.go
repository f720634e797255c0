package client_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/client"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/verbs"
)

// modeEnv picks what a child client process does: "reads" (readsEnv
// synchronous READs, checked, then exit), "flood" (as many READs as it can
// on floodVQs VQs until killed), "victim" (timed READs on request, see
// runVictim), else runChild's traffic until killed.
const (
	modeEnv  = "KRCORE_CLIENT_MODE"
	readsEnv = "KRCORE_CLIENT_READS"
	floodVQs = 8
)

// childSetup attaches and makes a VQ connected to node 2 with the region
// "table" and a 4 KiB MR.
func childSetup(ctx context.Context, sock string) (*client.Client, krcore.VQ, krcore.Region, krcore.MR, error) {
	c, err := client.Attach(ctx, client.Options{Socket: sock})
	if err != nil {
		return nil, nil, nil, nil, err
	}
	buf, err := c.RegMR(4096, verbs.AccessAll)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	q, err := c.Queue()
	if err == nil {
		err = q.Connect(ctx, 2, nil)
	}
	var g krcore.Region
	if err == nil {
		g, err = q.Region(ctx, "table")
	}
	return c, q, g, buf, err
}

// runReader does the READs one at a time and checks every byte.
func runReader(sock string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, _ := strconv.Atoi(os.Getenv(readsEnv))
	c, q, g, buf, err := childSetup(ctx, sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "reader:", err)
		return 1
	}
	defer c.Close()
	fmt.Println("ready")
	out := make([]krcore.Completion, 1)
	for i := range n {
		clear(buf.Bytes()[:17])
		if err := runSync(ctx, q, out, krcore.Request{ID: uint64(i), Op: verbs.OpRead, Local: buf.Range(0, 17), Remote: g.At(0)}); err != nil {
			fmt.Fprintln(os.Stderr, "reader:", err)
			return 1
		}
		if string(buf.Bytes()[:17]) != "hello from node 2" {
			fmt.Fprintf(os.Stderr, "reader: READ %d got %q\n", i, buf.Bytes()[:17])
			return 1
		}
	}
	return 0
}

// runFlooder keeps every VQ's credits full of READs until it is killed.
func runFlooder(sock string) int {
	ctx := context.Background()
	c, q0, g, buf, err := childSetup(ctx, sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flooder:", err)
		return 1
	}
	qs := []krcore.VQ{q0}
	for len(qs) < floodVQs {
		q, err := c.Queue()
		if err == nil {
			err = q.Connect(ctx, 2, nil)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "flooder:", err)
			return 1
		}
		qs = append(qs, q)
	}
	fmt.Println("ready")
	var wg sync.WaitGroup
	for _, q := range qs {
		wg.Add(1)
		go func() { // runs until the process is killed
			defer wg.Done()
			reqs := make([]krcore.Request, 16)
			for k := range reqs {
				reqs[k] = krcore.Request{Op: verbs.OpRead, Local: buf.Range(64, 8), Remote: g.At(0), Unsignaled: k != len(reqs)-1}
			}
			out := make([]krcore.Completion, 16)
			for {
				if _, err := q.Push(ctx, true, reqs...); err != nil {
					return
				}
				if q.Outstanding() > 32 {
					if _, err := q.PopWait(ctx, out); err != nil {
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	return 1
}

// poolQPs is the daemon's shared physical QPs, all types.
func poolQPs(st wire.Status) int {
	n := 0
	for _, p := range st.Pool {
		n += p.Count
	}
	return n
}

// TestClientProcesses: 8 client processes READ through one daemon at once;
// every READ succeeds and they share the daemon's pool (its QPs do not grow
// with the clients).
func TestClientProcesses(t *testing.T) {
	e := startEnv(t)
	reads := 300
	if testing.Short() {
		reads = 50
	}
	var cmds []*exec.Cmd
	var errs []*strings.Builder
	for range 8 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+e.sock, modeEnv+"=reads", readsEnv+"="+strconv.Itoa(reads),
			"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		cmds, errs = append(cmds, cmd), append(errs, &stderr)
	}
	var most, vqs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the pool while the clients run
		defer wg.Done()
		for {
			st := e.srv.Status()
			most.Store(max(most.Load(), int64(poolQPs(st))))
			vqs.Store(max(vqs.Load(), int64(st.Runtime.VQs)))
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond): // sampling the daemon's state
			}
		}
	}()
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("client process %d: %v: %s", i, err, errs[i])
		}
	}
	close(stop)
	wg.Wait()
	st := e.srv.Status()
	t.Logf("8 processes x %d READs; up to %d client VQs at once on %d pool QPs (%+v)", reads, vqs.Load(), most.Load(), st.Pool)
	if most.Load() > 3 { // one DCT, one DCI, at most one RC to the hot peer
		t.Errorf("pool grew to %d QPs for 8 clients: %+v", most.Load(), st.Pool)
	}
}

// TestKillLoop: a client process SIGKILLed mid-traffic, 100 times, while
// another client READs: the other never fails and the daemon ends with
// what it started with (QPs, VQs, MRs, clients, descriptors).
func TestKillLoop(t *testing.T) {
	// No RC pool: B's READs could make the peer hot enough for the runtime
	// to build an RC QP, which the pool count below would take for a leak.
	e := startEnv(t, core.Config{RCPeers: -1})
	ctx := ctxT(t)
	b := attach(t, e)
	qb, gb := connect(t, ctx, b)
	bufB, _ := b.RegMR(64, verbs.AccessAll)
	run(t, ctx, qb, krcore.Request{Op: verbs.OpRead, Local: bufB.Range(0, 8), Remote: gb.At(0)})
	base := e.srv.Status()
	baseFDs := fdCount(t)

	stop := make(chan struct{})
	var done, failed atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // B's traffic through every kill
		defer wg.Done()
		out := make([]krcore.Completion, 1)
		for i := uint64(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// Each READ gets its own deadline: the kills take longer
			// than one (ctxT's) on a loaded machine.
			octx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := qb.Push(octx, true, krcore.Request{ID: i, Op: verbs.OpRead, Local: bufB.Range(0, 8), Remote: gb.At(0)})
			if err == nil {
				_, err = qb.PopWait(octx, out)
			}
			cancel()
			if err != nil || out[0].Err() != nil || out[0].ID != i {
				failed.Add(1)
				t.Errorf("B: %v %+v", err, out[0])
				return
			}
			done.Add(1)
		}
	}()
	kills := 100
	if testing.Short() {
		kills = 20
	}
	t0 := time.Now()
	for range kills {
		killMidTraffic(t, e, startChild(t, e.sock), "child")
	}
	waitFor(t, "reclaim", func() bool {
		st := e.srv.Status()
		return len(st.Clients) == 1 && st.Runtime.VQs == base.Runtime.VQs && fdCount(t) == baseFDs
	})
	close(stop)
	wg.Wait()
	st := e.srv.Status()
	if st.Clients[0].MRs != base.Clients[0].MRs || poolQPs(st) != poolQPs(base) || st.Reclaim-base.Reclaim != uint64(kills) {
		t.Errorf("after %d kills: MRs %d (was %d), pool %+v (was %+v), reclaimed %d", kills,
			st.Clients[0].MRs, base.Clients[0].MRs, st.Pool, base.Pool, st.Reclaim-base.Reclaim)
	}
	t.Logf("%d clients killed in %v; B completed %d READs, %d failed; daemon fds %d, pool %+v", kills,
		time.Since(t0).Round(time.Millisecond), done.Load(), failed.Load(), fdCount(t), st.Pool)
}

// TestFloodFairness: one client flooding the daemon from many VQs does not
// raise another client's p99 8 B READ latency more than 2x. Both clients
// are processes of their own, as in a deployment; blocks with the flooder
// running and stopped (SIGSTOP) alternate, so both see the same machine.
func TestFloodFairness(t *testing.T) {
	e := startEnv(t)
	per := 400
	if testing.Short() || raceOn {
		per = 100
	}
	victimCmd, cmds, lines := startTalker(t, e.sock, modeEnv+"=victim")
	flood := startChild(t, e.sock, modeEnv+"=flood")
	block := func() []time.Duration {
		fmt.Fprintln(cmds, per)
		if !lines.Scan() {
			t.Fatalf("victim: %v", lines.Err())
		}
		var s []time.Duration
		for _, f := range strings.Fields(lines.Text()) {
			ns, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				t.Fatalf("victim: %q", lines.Text())
			}
			s = append(s, time.Duration(ns))
		}
		if len(s) != per {
			t.Fatalf("victim: %d latencies, want %d", len(s), per)
		}
		return s
	}
	flooder := func() wire.ClientStatus {
		for _, cs := range e.srv.Status().Clients {
			if int(cs.PID) == flood.Process.Pid {
				return cs
			}
		}
		return wire.ClientStatus{}
	}
	pushes := func() uint64 { return flooder().Pushes }
	var quiet, loud []time.Duration
	var fl, me, vi int64 // CPU ticks during the flood
	var wall, aloneWall time.Duration
	var alone, during uint64 // the flooder's pushes alone and during the victim's blocks
	for i := range 11 {
		a0, t0 := pushes(), time.Now()
		time.Sleep(20 * time.Millisecond) // the flooder alone: its rate with nobody to share with
		alone, aloneWall = alone+pushes()-a0, aloneWall+time.Since(t0)
		flood.Process.Signal(syscall.SIGSTOP)
		time.Sleep(2 * time.Millisecond) // let its requests in flight drain
		x := block()
		flood.Process.Signal(syscall.SIGCONT)
		time.Sleep(2 * time.Millisecond) // the flood back at full speed
		f0, m0, v0, w0, d0 := cpuTicks(flood.Process.Pid), cpuTicks(os.Getpid()), cpuTicks(victimCmd.Process.Pid), time.Now(), pushes()
		y := block()
		during += pushes() - d0
		fl += cpuTicks(flood.Process.Pid) - f0
		me += cpuTicks(os.Getpid()) - m0
		vi += cpuTicks(victimCmd.Process.Pid) - v0
		wall += time.Since(w0)
		if i > 0 { // the first pair warms up
			quiet, loud = append(quiet, x...), append(loud, y...)
		}
	}
	pq, pl := p99(quiet), p99(loud)
	t.Logf("victim percentiles without the flood: %s", percentiles(quiet))
	t.Logf("victim percentiles with it:           %s", percentiles(loud))
	busy := func(ticks int64) float64 { return float64(ticks) / 100 / wall.Seconds() } // USER_HZ
	t.Logf("during the flood (%v): CPUs busy: flooder %.2f, daemon %.2f, victim %.2f (of %d)", wall.Round(time.Millisecond), busy(fl), busy(me), busy(vi), runtime.NumCPU())
	rate := func(n uint64, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e6 }
	t.Logf("victim p99 8 B READ: %v without the flood, %v with it (%.2fx); medians %v, %v",
		pq, pl, float64(pl)/float64(pq), p50(quiet), p50(loud))
	t.Logf("flooder: %.2f M requests/s alone, %.2f M/s beside the victim; its pump napped %d times", rate(alone, aloneWall), rate(during, wall), flooder().Naps)
	if during < 1000 {
		t.Errorf("flooder pushed only %d requests beside the victim: no flood", during)
	}
	if pl > 2*pq {
		// The daemon paces a flooding client's pump beside an
		// interactive one (daemon.Config.ShareQuantum) so the flood
		// leaves a core free for the victim's wake-ups; run alone on an
		// idle 2-core machine this holds the p99 within 2x (1.5-1.8x).
		// Inside go test ./..., other packages' tests take the cores the
		// pacing frees, so the figure is reported there and enforced by
		// .ci/run, which runs this test alone with KRCORE_STRICT_FAIRNESS=1.
		if os.Getenv("KRCORE_STRICT_FAIRNESS") != "" {
			t.Fatalf("flood raised the victim's p99 from %v to %v (%.2fx, target <= 2x)", pq, pl, float64(pl)/float64(pq))
		}
		t.Skipf("flood raised the victim's p99 from %v to %v (%.2fx, target <= 2x; enforced with KRCORE_STRICT_FAIRNESS=1 on an idle machine)", pq, pl, float64(pl)/float64(pq))
	}
}

// runVictim is a client process that, for each count n read on stdin, does
// n synchronous 8 B READs and prints their latencies in nanoseconds on one
// line.
func runVictim(sock string) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, q, g, buf, err := childSetup(ctx, sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "victim:", err)
		return 1
	}
	defer c.Close()
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	out := make([]krcore.Completion, 1)
	for in.Scan() {
		n, _ := strconv.Atoi(in.Text())
		var line strings.Builder
		for i := range n {
			t0 := time.Now()
			if err := runSync(ctx, q, out, krcore.Request{ID: uint64(i), Op: verbs.OpRead, Local: buf.Range(0, 8), Remote: g.At(0)}); err != nil {
				fmt.Fprintln(os.Stderr, "victim:", err)
				return 1
			}
			fmt.Fprintf(&line, "%d ", time.Since(t0).Nanoseconds())
		}
		fmt.Println(line.String())
	}
	return 0
}

// runSync pushes r alone and waits for its completion, which must be r's
// and a success.
func runSync(ctx context.Context, q krcore.VQ, out []krcore.Completion, r krcore.Request) error {
	if _, err := q.Push(ctx, true, r); err != nil {
		return err
	}
	if _, err := q.PopWait(ctx, out[:1]); err != nil {
		return fmt.Errorf("request %d: %w", r.ID, err)
	}
	if err := out[0].Err(); err != nil || out[0].ID != r.ID {
		return fmt.Errorf("request %d: completion %+v: %w", r.ID, out[0], err)
	}
	return nil
}

// cpuTicks is the CPU time a process has used, in clock ticks (USER_HZ).
func cpuTicks(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return u + k
}

// percentile is the q-th percentile of s (0 < q < 1).
func percentile(s []time.Duration, q float64) time.Duration {
	s = slices.Clone(s)
	slices.Sort(s)
	return s[int(float64(len(s))*q)]
}

func p50(s []time.Duration) time.Duration { return percentile(s, 0.50) }
func p99(s []time.Duration) time.Duration { return percentile(s, 0.99) }

// percentiles describes the tail of s.
func percentiles(s []time.Duration) string {
	var b strings.Builder
	for _, q := range []float64{0.5, 0.9, 0.95, 0.99, 0.999} {
		fmt.Fprintf(&b, "p%g=%v ", q*100, percentile(s, q).Round(time.Microsecond))
	}
	return b.String()
}
