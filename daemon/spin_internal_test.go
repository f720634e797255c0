package daemon

import (
	"context"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/cluster"
	"github.com/krcore/krcore/daemon/wire"
)

// TestSpinLetsNetpollRun: while a pump spins (spinRounds), a goroutine
// woken by a file descriptor (here a pipe; in krcored the client's bell
// and the soft link's sockets) runs within a fraction of a millisecond.
// A spin that yields with runtime.Gosched keeps every P busy, so Go polls
// the network only from sysmon: the wake-up then waited milliseconds
// (2-4 ms median), until the spin ended.
func TestSpinLetsNetpollRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := &pump{g: c.Node(1).Group(), spin: 20 * time.Millisecond}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the pump's spin, over and over, as it finds no work
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				p.spinRounds()
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	const samples = 31
	ds := make([]time.Duration, 0, samples)
	woke := make(chan time.Time)
	go func() {
		b := make([]byte, 1)
		for {
			if _, err := r.Read(b); err != nil {
				close(woke)
				return
			}
			woke <- time.Now()
		}
	}()
	for range samples {
		time.Sleep(300 * time.Microsecond) // the reader is parked in the poller
		start := time.Now()
		if _, err := w.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
		select {
		case at := <-woke:
			ds = append(ds, at.Sub(start))
		case <-ctx.Done():
			t.Fatal("pipe reader never woke")
		}
	}
	slices.Sort(ds)
	med := ds[len(ds)/2]
	t.Logf("pipe wake-up beside a spinning pump: median %v, max %v", med, ds[len(ds)-1])
	// Idle, this machine's median is ~10 us even at load 20; 1 ms is well
	// under what a starved poller costs (until the next sysmon poll).
	if med > time.Millisecond {
		t.Errorf("pipe wake-up beside a spinning pump: median %v, want under 1ms", med)
	}
}

// TestSpinEndsWhenClientSleeps: a pump's spin ends as soon as the client
// sleeps on a bell of a VQ the pump last worked on (it waits for the
// fabric, an echo say, and its next push will ring the doorbell), and
// lasts its whole length while the client stays awake or sleeps only on
// other VQs: a spin through a ping-pong's round trip holds a core the
// round trip needs on a machine of two.
func TestSpinEndsWhenClientSleeps(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	q, err := c.Node(1).Queue()
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	r, err := wire.NewRing(make([]byte, wire.RingSize(64)), 64)
	if err != nil {
		t.Fatal(err)
	}
	v := &vq{ring: r, q: q, ctx: ctx}
	const spin = 20 * time.Millisecond
	p := &pump{g: c.Node(1).Group(), spin: spin, vqs: []*vq{v}, out: make([]krcore.Completion, 8)}
	for _, tc := range []struct {
		name     string
		flag     int // the client's sleep flag raised, or -1
		workedIn uint64
		long     bool // the spin lasts its whole length
	}{
		{"client awake", -1, 0, true},
		{"client asleep on its messages", wire.ClientMsg, 0, false},
		{"client asleep on its completions", wire.ClientCQ, 0, false},
		{"client asleep on a VQ of older work", wire.ClientMsg, 1, true},
	} {
		r.Ctr(wire.ClientMsg).Store(0)
		r.Ctr(wire.ClientCQ).Store(0)
		if tc.flag >= 0 {
			r.Ctr(tc.flag).Store(1)
		}
		v.workedIn, p.worked = tc.workedIn, 2
		if tc.workedIn == 0 {
			v.workedIn = p.worked
		}
		start := time.Now()
		if p.spinRounds() {
			t.Fatalf("%s: the spin found work in an empty ring", tc.name)
		}
		took := time.Since(start)
		switch {
		case tc.long && took < spin:
			t.Errorf("%s: the spin ended after %v, want %v", tc.name, took, spin)
		case !tc.long && took >= spin:
			t.Errorf("%s: the spin lasted %v, want it to end at once", tc.name, took)
		}
	}
}
