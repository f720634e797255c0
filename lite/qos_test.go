package lite_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/lite"
)

// TestCallerPriority: a Low Caller reads, writes and calls like its Node,
// with the gate on or off, and fails with ErrClosed once the Node closed.
func TestCallerPriority(t *testing.T) {
	masterAPI, mappers := apis(t)
	ctx := ctxT(t)
	master, mapper := open(t, masterAPI), open(t, mappers["embedded"])
	if _, err := master.Malloc(ctx, "qos", 4096, lite.Read|lite.Write); err != nil {
		t.Fatal(err)
	}
	h, err := mapper.Map(ctx, 2, "qos", lite.Read|lite.Write)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := master.RegisterRPC(7)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := svc.Recv(context.Background())
			if err != nil {
				return
			}
			svc.Reply(context.Background(), c, c.Req)
		}
	}()
	low := mapper.WithPriority(lite.Low)
	for _, on := range []bool{false, true} {
		mapper.SetQoS(on)
		if err := low.Write(ctx, h, 8, []byte("low")); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 3)
		if err := low.Read(ctx, h, 8, got); err != nil || string(got) != "low" {
			t.Fatalf("QoS %v: low Read: %v %q", on, err, got)
		}
		resp := make([]byte, 16)
		if k, err := low.Call(ctx, 2, 7, []byte("ping"), resp); err != nil || !bytes.Equal(resp[:k], []byte("ping")) {
			t.Fatalf("QoS %v: low Call: %v %q", on, err, resp[:k])
		}
	}
	if err := mapper.WithPriority(lite.Low+1).Read(ctx, h, 0, make([]byte, 8)); !errors.Is(err, krcore.ErrInvalid) {
		t.Fatalf("Read at an unknown priority: %v, want ErrInvalid", err)
	}
	mapper.Close()
	if err := low.Read(ctx, h, 0, make([]byte, 8)); !errors.Is(err, krcore.ErrClosed) {
		t.Fatalf("low Read after Close: %v, want ErrClosed", err)
	}
}

// qosRig is a mapper node whose High caller reads 8 bytes in a loop while
// Low callers flood with 64 KiB Reads and Writes.
type qosRig struct {
	n   *lite.Node
	h   lite.Handle
	low *lite.Caller
}

// high runs 8-byte High Reads for d (after warm, discarded) and returns
// their latencies.
func (r *qosRig) high(t *testing.T, warm, d time.Duration) []time.Duration {
	ctx := context.Background()
	buf := make([]byte, 8)
	var lats []time.Duration
	start := time.Now()
	for t0 := start; t0.Sub(start) < warm+d; {
		if err := r.n.Read(ctx, r.h, 0, buf); err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		if t0.Sub(start) >= warm {
			lats = append(lats, t1.Sub(t0))
		}
		t0 = t1
	}
	return lats
}

// flood starts goroutines of Low 64 KiB Reads and Writes; stop ends them
// and returns the bytes they moved.
func (r *qosRig) flood(t *testing.T) (stop func() int64) {
	ctx, cancel := context.WithCancel(context.Background())
	var moved atomic.Int64
	var wg sync.WaitGroup
	for g := range 3 {
		wg.Go(func() {
			buf := make([]byte, 256<<10)
			off := g * len(buf)
			for i := 0; ctx.Err() == nil; i++ {
				var err error
				if i%2 == 0 {
					err = r.low.Read(ctx, r.h, off, buf)
				} else {
					err = r.low.Write(ctx, r.h, off, buf)
				}
				if err != nil && ctx.Err() == nil {
					t.Error(err)
					return
				}
				if err == nil {
					moved.Add(int64(len(buf)))
				}
			}
		})
	}
	return func() int64 { cancel(); wg.Wait(); return moved.Load() }
}

func median(f []float64) float64 {
	slices.Sort(f)
	return f[len(f)/2]
}

// TestQoS: LITE's QoS end to end. High's 8 B Read p99 alone, beside a Low
// flood with the gate on, and with it off, in alternating blocks; then
// Low's throughput alone and once High went idle after throttling it.
// The default asserts the direction (the gate helps High; Low gets its
// full rate back when High is idle); KRCORE_STRICT_QOS=1 enforces the
// 1.3x target, which needs a quiet machine.
func TestQoS(t *testing.T) {
	if testing.Short() || raceOn {
		t.Skip("timing test")
	}
	masterAPI, mappers := apis(t)
	for name, api := range mappers {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			master, mapper := open(t, masterAPI), open(t, api)
			if _, err := master.Malloc(ctx, "qos", 1<<20, lite.Read|lite.Write); err != nil {
				t.Fatal(err)
			}
			h, err := mapper.Map(ctx, 2, "qos", lite.Read|lite.Write)
			if err != nil {
				t.Fatal(err)
			}
			r := &qosRig{n: mapper, h: h, low: mapper.WithPriority(lite.Low)}
			// p99s of microseconds on 2 shared cores: one retry, logged,
			// before a miss counts.
			misses, ok := qosRound(t, r)
			if len(misses) == 0 && ok {
				return
			}
			t.Logf("retrying once: %q (1.3x target held: %v)", misses, ok)
			misses, ok = qosRound(t, r)
			for _, m := range misses {
				t.Error(m)
			}
			if !ok {
				t.Fatal("QoS missed the 1.3x target twice (KRCORE_STRICT_QOS)")
			}
		})
	}
}

// lowRates returns Low's flood rate (bytes/s) alone with the gate off, and
// the median over pairs of blocks of its rate with the gate on once High,
// having run beside it (and throttled it), has been idle for a window,
// relative to alone in the same pair; the pairs alternate which runs
// first.
func lowRates(t *testing.T, r *qosRig) (alone, idle float64) {
	const block = 150 * time.Millisecond
	low := func(on bool) float64 {
		r.n.SetQoS(on)
		if on {
			stop := r.flood(t)
			r.high(t, 0, block/2) // High throttles Low, then goes idle
			if math.IsInf(r.n.QoSRate(), 1) {
				t.Log("the gate was not throttling Low at the end of High's run")
			}
			stop()
			// Idle means idle for the policy's window (10 ms): the
			// throttle lifts at Low's first operation after it, not
			// during it, by design (policy 2).
			time.Sleep(20 * time.Millisecond)
		}
		stop := r.flood(t)
		time.Sleep(block)
		return float64(stop()) / block.Seconds()
	}
	var alones, ratios []float64
	for i := range 7 {
		var a, o float64
		if i%2 == 0 {
			a, o = low(false), low(true)
		} else {
			o, a = low(true), low(false)
		}
		alones, ratios = append(alones, a), append(ratios, o/a)
	}
	return median(alones), median(ratios)
}

// minQoSSamples is the fewest High Reads a round's blocks must each take
// for their p99s to count.
const minQoSSamples = 100

// qosRound measures once and returns what went the wrong way (misses)
// and whether the strict target held.
func qosRound(t *testing.T, r *qosRig) (misses []string, ok bool) {
	const (
		rounds = 3
		warm   = 150 * time.Millisecond
		block  = 400 * time.Millisecond
	)
	var aloneOff, aloneOn, on, off []time.Duration
	var lowOn, lowOff []float64
	throttled := 0
	highAlone := func(on bool) []time.Duration {
		r.n.SetQoS(on)
		return r.high(t, warm/3, block)
	}
	for i := range rounds {
		if i%2 == 0 { // alternating which runs first
			aloneOff = append(aloneOff, highAlone(false)...)
			aloneOn = append(aloneOn, highAlone(true)...)
		} else {
			aloneOn = append(aloneOn, highAlone(true)...)
			aloneOff = append(aloneOff, highAlone(false)...)
			r.n.SetQoS(true)
		}

		stop := r.flood(t)
		on = append(on, r.high(t, warm, block)...)
		// Seen throttling at the end of High's run; the gate lifts the
		// throttle a quiet window (10 ms) after High's last op, so a
		// late look also counts Low held below its rate without the gate
		// in the same round (below).
		seen := !math.IsInf(r.n.QoSRate(), 1)
		lowOn = append(lowOn, float64(stop())/(warm+block).Seconds())

		r.n.SetQoS(false)
		stop = r.flood(t)
		off = append(off, r.high(t, warm, block)...)
		lowOff = append(lowOff, float64(stop())/(warm+block).Seconds())
		if seen || lowOn[i] < lowOff[i]/2 {
			throttled++
		}
	}
	// A p99 of a handful of samples says nothing: at nice 19 beside busy
	// loops High took 0-37 Reads in 400 ms blocks (hundreds of thousands
	// when the process runs), and the round measured the scheduler.
	if n := min(len(aloneOff), len(aloneOn), len(on), len(off)); n < minQoSSamples {
		t.Skipf("High's fewest Reads in %d blocks of %v: %d; the process hardly ran", rounds, block, n)
	}
	pa, pao, pon, poff := lite.P99(aloneOff), lite.P99(aloneOn), lite.P99(on), lite.P99(off)
	mb := func(f float64) float64 { return f / (1 << 20) }
	t.Logf("High 8 B Read p99 (samples): alone %v (%d), alone with the gate on %v (%d), beside the Low flood with QoS %v (%d) = %.2fx alone, without QoS %v (%d) = %.2fx",
		pa, len(aloneOff), pao, len(aloneOn), pon, len(on), float64(pon)/float64(pa), poff, len(off), float64(poff)/float64(pa))
	alone, idle := lowRates(t, r)
	t.Logf("Low MiB/s (medians of %d): beside High with QoS %.1f, without %.1f; alone %.1f; High idle after throttling it: %.2fx alone (median of 7 pairs)",
		rounds, mb(median(lowOn)), mb(median(lowOff)), mb(alone), idle)
	// The direction: the gate helps High where the flood hurts it. A
	// flood that does not (embedded, a 64 KiB READ is an in-process copy,
	// and High's p99 beside it is the machine's noise) leaves the gate
	// nothing to fix: then only the target is checked, under
	// KRCORE_STRICT_QOS.
	if float64(poff) > 1.3*float64(pa) && pon >= poff {
		misses = append(misses, fmt.Sprintf("QoS did not lower High's p99 beside the flood: %v with, %v without, %v alone", pon, poff, pa))
	}
	if idle < 0.8 {
		misses = append(misses, fmt.Sprintf("Low with High idle moved %.2fx what it moves alone: not its full rate", idle))
	}
	if throttled == 0 {
		misses = append(misses, fmt.Sprintf("the gate never throttled Low beside High (in %d blocks)", rounds))
	}
	ok = float64(pon) <= 1.3*float64(pa)
	if !ok && os.Getenv("KRCORE_STRICT_QOS") == "" {
		t.Logf("High's p99 beside the flood with QoS is %.2fx alone (target 1.3x, enforced with KRCORE_STRICT_QOS=1 on a quiet machine)", float64(pon)/float64(pa))
		return misses, true
	}
	return misses, ok
}
