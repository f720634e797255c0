package main

import (
	"context"
	"image/png"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

func TestMain(m *testing.M) {
	runClient(time.Now()) // a client process a test started
	runKrcored()
	os.Exit(m.Run())
}

// testSite starts a small site for a test that starts client processes,
// and returns it with the test's context.
func testSite(t *testing.T, keys int) (*site, context.Context) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	s, err := startSite(ctx, fabric{}, 1, keys, 32, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.close(); err != nil {
			t.Error(err)
		}
	})
	return s, ctx
}

// TestSpike: the scenario, small, in every mode (the base client has 2.5 s
// to start, for loaded machines and -race binaries): each spike client
// reports its bootstrap, the clients make progress before and after the
// spike, and the CSVs and the plot are written.
func TestSpike(t *testing.T) {
	s, ctx := testSite(t, 2000)
	cfg := spikeConfig{Modes: []string{modeRaw, modeEmbedded, modeDaemon}, Base: 1, Spike: 2, Workload: "A", Keys: 2000, Value: 32,
		Warm: 2500 * time.Millisecond, After: time.Second, Bucket: 100 * time.Millisecond, Rounds: 1}
	dir := t.TempDir()
	sums, err := runSpike(ctx, s, cfg, dir, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range cfg.Modes {
		sm := sums[m]
		if sm.Spawned != cfg.Spike || sm.Total.Typical <= 0 || sm.InProcess.Typical <= 0 || sm.InProcess.Typical > sm.Total.Typical {
			t.Errorf("%s: bootstrap of %d clients: total %v us, in-process %v us", m, sm.Spawned, sm.Total.Typical, sm.InProcess.Typical)
		}
		if sm.TputBefore <= 0 || sm.TputAfter <= 0 || sm.Before.Iterations == 0 || sm.After.Iterations == 0 {
			t.Errorf("%s: %.0f ops/s before the spike, %.0f after; %d and %d lookups timed", m, sm.TputBefore, sm.TputAfter, sm.Before.Iterations, sm.After.Iterations)
		}
	}
	f, err := os.Open(filepath.Join(dir, "race-throughput.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if img, err := png.Decode(f); err != nil || img.Bounds().Dx() == 0 {
		t.Fatalf("plot: %v", err)
	}
	for _, name := range []string{"race-throughput.csv", "race-bootstrap.csv"} {
		if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.Size() == 0 {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

// TestLinearizable: in every mode, client processes' gets and puts on a
// few keys, one client killing itself between a put's block WRITE and its
// slot CAS and another killed at a random moment, form a linearizable
// history (porcupine), the table read afterwards included.
func TestLinearizable(t *testing.T) {
	s, ctx := testSite(t, 10)
	for _, mode := range []string{modeRaw, modeEmbedded, modeDaemon} {
		rep, err := runLin(ctx, s, linConfig{Mode: mode, Clients: 3, Ops: 150, Keys: 2, Kills: 2, Timeout: time.Minute}, "", io.Discard)
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		// The coordinator's victim may, on a loaded machine, finish before
		// the coordinator reads the line it waits for; the one that kills
		// itself mid-put always dies there.
		if rep.Result != porcupine.Ok || rep.Killed < 1 || rep.KilledMidPut < 1 || rep.Ops < 150 {
			t.Errorf("%s: %+v", mode, rep)
		}
	}
}

// TestCheckerRefuses: the model refuses a stale read and a lost put, so a
// passing check means something.
func TestCheckerRefuses(t *testing.T) {
	put := func(c int, v string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: c, Input: linInput{Key: "k", Put: true, Value: v}, Call: call, Return: ret}
	}
	get := func(c int, v string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: c, Input: linInput{Key: "k"}, Output: linOutput{Value: v, Found: true}, Call: call, Return: ret}
	}
	good := []porcupine.Operation{put(0, "a", 0, 10), get(1, "a", 5, 15), get(1, "a", 20, 30), put(2, "b", 25, math.MaxInt32), get(1, "b", 40, 50)}
	stale := []porcupine.Operation{put(0, "a", 0, 10), get(1, initialValue, 20, 30)}
	lost := []porcupine.Operation{put(0, "a", 0, 10), put(0, "b", 20, 30), get(1, "a", 40, 50)}
	if !porcupine.CheckOperations(kvModel, good) {
		t.Fatal("a linearizable history refused")
	}
	for name, h := range map[string][]porcupine.Operation{"stale read": stale, "lost put": lost} {
		if porcupine.CheckOperations(kvModel, h) {
			t.Errorf("%s passed", name)
		}
	}
}

// TestZipf: keys stay in range and the popular ones take YCSB's share
// (theta 0.99 over 1000 items: the top 10 items ~ 39% of draws).
func TestZipf(t *testing.T) {
	z := newZipf(1000, rand.New(rand.NewPCG(1, 2)))
	counts := map[uint64]int{}
	const draws = 200000
	for range draws {
		k := z.next()
		if k >= 1000 {
			t.Fatalf("key %d of 1000", k)
		}
		counts[k]++
	}
	top := make([]int, 0, len(counts))
	for _, n := range counts {
		top = append(top, n)
	}
	slices.SortFunc(top, func(a, b int) int { return b - a })
	sum := 0
	for _, n := range top[:10] {
		sum += n
	}
	if share := float64(sum) / draws; share < 0.3 || share > 0.5 {
		t.Fatalf("top 10 of 1000 keys drew %.2f of the requests, want ~0.39", share)
	}
}
