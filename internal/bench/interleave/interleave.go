// Package interleave measures series that are compared as a ratio in
// alternating blocks. These machines are shared: the same TCP ping-pong
// measures 15 us one second and 50 us the next, as other jobs and the
// hypervisor come and go, so a baseline taken a minute before the test it
// divides can be off by 3x either way. Splitting each series into Blocks
// blocks and running them in turns (ABBA for two, a rotating and reversing
// order for more) makes numerator and denominator see the same noise.
package interleave

import (
	"time"

	"github.com/krcore/krcore/internal/perf"
)

// Blocks is how many blocks each side of a comparison is split into.
const Blocks = 10

// Latency is one side of an interleaved latency comparison: Run times
// iters operations after warmup untimed ones; Samples gathers the blocks'.
type Latency struct {
	Run     func(warmup, iters int) ([]time.Duration, error)
	Samples []time.Duration
}

// Block is one block of the series: n timed operations.
func (s *Latency) Block(n int) func() error {
	return func() error {
		x, err := s.Run(0, n)
		s.Samples = append(s.Samples, x...)
		return err
	}
}

// WarmLatency runs warmup untimed operations on each series, in order.
func WarmLatency(warmup int, series ...*Latency) error {
	for _, s := range series {
		if _, err := s.Run(warmup, 0); err != nil {
			return err
		}
	}
	return nil
}

// Bandwidth is one side of an interleaved bandwidth comparison: Run streams
// total messages. Marks lays the blocks end to end on the series' own
// clock, so the average is total bytes over the time that series ran;
// BlockMarks keeps each block's marks for perf.MedianBlock.
type Bandwidth struct {
	Run        func(total int) ([]perf.Mark, error)
	Marks      []perf.Mark
	BlockMarks [][]perf.Mark
}

// NewBandwidth is a bandwidth series that streams with run.
func NewBandwidth(run func(total int) ([]perf.Mark, error)) *Bandwidth {
	return &Bandwidth{Run: run, Marks: []perf.Mark{{}}}
}

// Block is one block of the series: n messages streamed.
func (s *Bandwidth) Block(n int) func() error {
	return func() error {
		m, err := s.Run(n)
		if err == nil {
			s.Marks, s.BlockMarks = joinMarks(s.Marks, m), append(s.BlockMarks, m)
		}
		return err
	}
}

// WarmBandwidth streams warmup messages (at least one) on each series, in
// order, untimed.
func WarmBandwidth(warmup int, series ...*Bandwidth) error {
	for _, s := range series {
		if _, err := s.Run(max(warmup, 1)); err != nil {
			return err
		}
	}
	return nil
}

// joinMarks appends a block's marks to a series' marks, laid end to end on
// the series' own clock.
func joinMarks(all, block []perf.Mark) []perf.Mark {
	if len(block) == 0 {
		return all
	}
	base := all[len(all)-1]
	for _, m := range block[1:] {
		all = append(all, perf.Mark{At: base.At + m.At, Msgs: base.Msgs + m.Msgs})
	}
	return all
}

// PerBlock is how many of a series' iters each of its Blocks blocks
// runs: at least one, so a small -n still measures.
func PerBlock(iters int) int { return max(iters/Blocks, 1) }

// Pair runs Blocks blocks of a and b in ABBA order.
func Pair(a, b func() error) error {
	for i := range Blocks {
		first, second := a, b
		if i%2 == 1 {
			first, second = b, a
		}
		if err := first(); err != nil {
			return err
		}
		if err := second(); err != nil {
			return err
		}
	}
	return nil
}

// Rotate runs Blocks blocks of each function, the order rotating and
// reversing from block to block (ABC, CBA, BCA, ACB ...), so no series
// always runs first or right after the same neighbour.
func Rotate(fs ...func() error) error {
	n := len(fs)
	for i := range Blocks {
		for k := range n {
			j := (k + i/2) % n
			if i%2 == 1 {
				j = (n - 1 - k + i/2) % n
			}
			if err := fs[j](); err != nil {
				return err
			}
		}
	}
	return nil
}
