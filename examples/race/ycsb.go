package main

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
)

// workloads are YCSB's core workloads A, B and C: the share of
// operations that are reads (the rest update an existing key).
var workloads = map[string]float64{"A": 0.50, "B": 0.95, "C": 1.00}

// zipfTheta is YCSB's default request distribution constant.
const zipfTheta = 0.99

// zipf draws item numbers in [0, n) with YCSB's ZipfianGenerator (Gray et
// al., "Quickly generating billion-record synthetic databases"), then
// scrambles them as YCSB's ScrambledZipfianGenerator does, so the popular
// keys are spread over the table instead of being its first ones.
type zipf struct {
	n                       uint64
	alpha, zetan, eta, half float64
	rng                     *rand.Rand
}

// newZipf prepares the generator for n items: O(n), once per process.
func newZipf(n uint64, rng *rand.Rand) *zipf {
	zeta := func(n uint64) float64 {
		s := 0.0
		for i := uint64(1); i <= n; i++ {
			s += 1 / math.Pow(float64(i), zipfTheta)
		}
		return s
	}
	z := &zipf{n: n, alpha: 1 / (1 - zipfTheta), zetan: zeta(n), rng: rng, half: math.Pow(0.5, zipfTheta)}
	z.eta = (1 - math.Pow(2/float64(n), 1-zipfTheta)) / (1 - zeta(2)/z.zetan)
	return z
}

// next is the next key number.
func (z *zipf) next() uint64 {
	u := z.rng.Float64()
	uz := u * z.zetan
	var item uint64
	switch {
	case uz < 1:
		item = 0
	case uz < 1+z.half:
		item = 1
	default:
		item = min(uint64(float64(z.n)*math.Pow(z.eta*u-z.eta+1, z.alpha)), z.n-1)
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], item)
	h := fnv.New64a()
	h.Write(b[:])
	return h.Sum64() % z.n
}

// keyOf is key number i as YCSB names it.
func keyOf(i uint64) []byte { return fmt.Appendf(nil, "user%d", i) }
