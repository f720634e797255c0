package main

import (
	"math/rand/v2"
)

// damping is PageRank's damping factor.
const damping = 0.85

// graph is a directed graph as one partition needs it: every vertex's
// out-degree, and the in-edges of the vertices in [lo, hi).
type graph struct {
	v      int
	outdeg []int32
	lo, hi int
	in     [][]int32 // in[v-lo]: the sources of v's in-edges
}

// generate makes the graph of v vertices and e edges seeded by seed, with
// power-law (Zipf) out- and in-degrees, keeping the in-edges of [lo, hi).
// Every process generates the same graph from the same seed.
func generate(seed uint64, v, e, lo, hi int) *graph {
	r := rand.New(rand.NewPCG(seed, 16))
	perm := r.Perm(v) // scatters the hubs over the partitions
	zu := rand.NewZipf(r, 1.3, 1, uint64(v-1))
	zv := rand.NewZipf(r, 1.1, 1, uint64(v-1))
	g := &graph{v: v, outdeg: make([]int32, v), lo: lo, hi: hi, in: make([][]int32, hi-lo)}
	for range e {
		u, w := perm[zu.Uint64()], perm[int(zv.Uint64()+uint64(v)/2)%v]
		if u == w {
			continue
		}
		g.outdeg[u]++
		if w >= lo && w < hi {
			g.in[w-lo] = append(g.in[w-lo], int32(u))
		}
	}
	return g
}

// partition is the range of vertices worker p of n owns (p is 1..n).
func partition(v, n, p int) (lo, hi int) {
	return (p - 1) * v / n, p * v / n
}

// step computes the next ranks of g's vertices [lo, hi) into next from
// rank, every vertex's rank, and dangling, the total rank of the vertices
// without out-edges (spread over all).
func (g *graph) step(rank []float64, dangling float64, next []float64) {
	base := (1-damping)/float64(g.v) + damping*dangling/float64(g.v)
	for i, srcs := range g.in {
		var s float64
		for _, u := range srcs {
			s += rank[u] / float64(g.outdeg[u])
		}
		next[i] = base + damping*s
	}
}

// danglingOf is the total rank of the vertices in [lo, lo+len(rank)) with
// no out-edges.
func (g *graph) danglingOf(lo int, rank []float64) float64 {
	var d float64
	for i, r := range rank {
		if g.outdeg[lo+i] == 0 {
			d += r
		}
	}
	return d
}

// pagerank is the single-process computation the distributed one must
// equal: iters steps from the uniform ranks.
func pagerank(seed uint64, v, e, iters int) []float64 {
	g := generate(seed, v, e, 0, v)
	rank, next := make([]float64, v), make([]float64, v)
	for i := range rank {
		rank[i] = 1 / float64(v)
	}
	for range iters {
		g.step(rank, g.danglingOf(0, rank), next)
		rank, next = next, rank
	}
	return rank
}
