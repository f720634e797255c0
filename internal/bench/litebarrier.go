package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/krcore/krcore"
	"github.com/krcore/krcore/internal/perf"
)

// The barrier series: liteParticipants goroutines of one side's Node meet
// at a lite Barrier mastered by the master node, generation after
// generation; the figure is the time per generation (elapsed /
// generations), the median of 3 rounds.
const liteParticipants = 8

// barriers adds each side's barrier figure at place.
func (b *liteBench) barriers(ctx context.Context, place string, master krcore.NodeID, sides []*liteSide) error {
	gens := max(b.c.n/20, 5)
	for _, s := range sides {
		var per []float64
		for range 3 {
			d, err := s.barrierRound(ctx, master, gens)
			if err != nil {
				return fmt.Errorf("%s barrier of %d%s: %w", place, liteParticipants, s.suffix, err)
			}
			per = append(per, d.Seconds()*1e6/float64(gens))
		}
		via := "embedded"
		if s.suffix != "" {
			via = "through krcored"
		}
		b.out.AddFigures(perf.Figure(fmt.Sprintf("%s %s: lite barrier of %d participants, per generation (median of 3 rounds)", place, via, liteParticipants),
			median(per), " usec"))
	}
	return nil
}

// barrierRound has liteParticipants goroutines pass gens generations of
// the side's barrier and returns the time until the last is through.
func (s *liteSide) barrierRound(ctx context.Context, master krcore.NodeID, gens int) (time.Duration, error) {
	name := "krbench-barrier" + s.suffix
	errs := make(chan error, liteParticipants)
	t0 := time.Now()
	for range liteParticipants {
		go func() {
			var err error
			for g := 0; g < gens && err == nil; g++ {
				err = s.node.Barrier(ctx, master, name, liteParticipants)
			}
			errs <- err
		}()
	}
	var first error
	for range liteParticipants {
		first = firstErr(first, <-errs)
	}
	return time.Since(t0), first
}
