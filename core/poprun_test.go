package core_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/verbs"
)

// TestPopRuns: two queues on one DCI (RC-only: one RC QP) push batches of
// 8 B READs, most unsignaled, some refused, on two MRs, and pop them with
// Pop into small arrays, one goroutine for both queues or one each. A
// completion then retires a run of one queue's requests at once
// (completeRun, retireRange), with the other queue's requests between
// runs, refused ones leaving gaps in a run's sequence numbers, and
// completions that out has no room for marked done for a later Pop. Each
// queue gets exactly its signaled and refused requests' completions, in
// order, a success with its length, whether a batch fits in the QP (pushed
// straight into its ring: pushRun) or not; at the end every credit is back, and
// once the queues close no MR use is left.
func TestPopRuns(t *testing.T) {
	for _, conc := range []bool{false, true} {
		for _, depth := range []int{8, 0} { // 8: batches outgrow the QP, the rest waits in its backlog
			name := fmt.Sprintf("one-goroutine/depth-%d", depth)
			if conc {
				name = fmt.Sprintf("goroutine-each/depth-%d", depth)
			}
			t.Run(name, func(t *testing.T) {
				inModes(t, func(t *testing.T, m mode) { popRuns(t, m, depth, conc) }, modeDC, modeNoDC)
			})
		}
	}
}

// popRun is one queue of TestPopRuns: what it pushed and still expects.
type popRun struct {
	q    *core.Queue
	id   uint64
	r    *rand.Rand
	want []krcore.Completion // signaled or refused, in push order
}

func popRuns(t *testing.T, m mode, depth int, conc bool) {
	const credits = 16
	c := m.start(t, 2, core.Config{DCIs: 1, RCPeers: -1, Credits: credits, Depth: depth, Path: patientPath})
	a, b := c.Node(1), c.Node(2)
	serve(t, b, "data", 4096)
	g, err := a.Region(ctx(t), 2, "data")
	if err != nil {
		t.Fatal(err)
	}
	var mrs [2]krcore.MR
	for i := range mrs {
		if mrs[i], err = a.RegMR(64, verbs.AccessAll); err != nil {
			t.Fatal(err)
		}
	}
	runs := [2]*popRun{}
	for i := range runs {
		runs[i] = &popRun{q: mustQueue(t, a, 2), id: uint64(i) << 32, r: rand.New(rand.NewPCG(uint64(i), 3))}
	}
	c0 := ctx(t)
	const rounds = 300
	if conc {
		var wg sync.WaitGroup
		errs := make(chan string, 2)
		for _, pr := range runs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					pr.push(t, g, mrs)
					if msg := pr.maybePop(); msg != "" {
						errs <- msg
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for msg := range errs {
			t.Fatal(msg)
		}
	} else {
		for i := range rounds {
			for _, pr := range runs {
				pr.push(t, g, mrs)
			}
			for k := range runs {
				if msg := runs[(i+k)%2].maybePop(); msg != "" { // the later pusher first, half the time
					t.Fatal(msg)
				}
			}
		}
	}
	for _, pr := range runs {
		for len(pr.want) > 0 || pr.q.Outstanding() > 0 {
			if msg := pr.pop(); msg != "" {
				t.Fatal(msg)
			}
			if c0.Err() != nil {
				t.Fatalf("%d completions never came: %s", len(pr.want), core.DebugState(pr.q))
			}
			runtime.Gosched()
		}
		if n := core.Credits(pr.q); n != credits {
			t.Errorf("%d credits free after every request finished, want %d", n, credits)
		}
	}
	for _, pr := range runs {
		pr.q.Close()
	}
	for i, mr := range mrs {
		if n := core.MRUses(mr); n != 0 {
			t.Errorf("MR %d: %d uses left after every request finished and the queues closed", i, n)
		}
	}
}

// push pushes a batch of 1-20 READs, each unsignaled with probability
// 3/4 and refused (beyond the region) with 1/10, on either MR.
func (pr *popRun) push(t *testing.T, g krcore.Region, mrs [2]krcore.MR) {
	r := pr.r
	reqs := make([]krcore.Request, 1+r.IntN(20))
	for i := range reqs {
		off := uint64(8 * r.IntN(512))
		if r.IntN(10) == 0 {
			off = 4093 // its 8 bytes cross the region's end
		}
		reqs[i] = krcore.Request{ID: pr.id + uint64(i), Op: verbs.OpRead, Local: mrs[r.IntN(2)].Range(8*r.IntN(8), 8),
			Remote: g.At(off), Unsignaled: r.IntN(4) != 0}
	}
	n, _ := pr.q.Push(ctx(t), false, reqs...) // out of credit: the rest are not pushed
	for _, req := range reqs[:n] {
		switch {
		case req.Remote.Off == 4093:
			pr.want = append(pr.want, krcore.Completion{ID: req.ID, Op: req.Op, Status: verbs.RemAccessErr})
		case !req.Unsignaled:
			pr.want = append(pr.want, krcore.Completion{ID: req.ID, Op: req.Op, Status: verbs.Success, Len: 8})
		}
	}
	pr.id += uint64(n)
}

// maybePop pops (pop) half the time: completions left unpopped fill the
// queue's completion ring, which then wraps around.
func (pr *popRun) maybePop() string {
	if pr.r.IntN(2) == 0 {
		return ""
	}
	return pr.pop()
}

// pop pops into 1-4 completions and checks them against want; it returns
// what went wrong, if anything.
func (pr *popRun) pop() string {
	var out [4]krcore.Completion
	k := pr.q.Pop(out[:1+pr.r.IntN(len(out))])
	for _, got := range out[:k] {
		if len(pr.want) == 0 {
			return fmt.Sprintf("unexpected completion %+v", got)
		}
		if w := pr.want[0]; got.ID != w.ID || got.Op != w.Op || got.Len != w.Len || (got.Status == verbs.Success) != (w.Status == verbs.Success) {
			return fmt.Sprintf("completion %+v, want %+v", got, w)
		}
		pr.want = pr.want[1:]
	}
	return ""
}
