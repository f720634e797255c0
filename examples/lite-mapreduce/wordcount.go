package main

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strconv"
	"strings"
)

// counts maps a word to its number of occurrences.
type counts map[string]int

// generate makes words words of text drawn from a vocabulary of vocab
// words with a power-law (Zipf) frequency, as natural text has.
func generate(seed uint64, words, vocab int) []byte {
	r := rand.New(rand.NewPCG(seed, 15))
	z := rand.NewZipf(r, 1.1, 1, uint64(vocab-1))
	var b bytes.Buffer
	for i := range words {
		k := z.Uint64()
		b.WriteString("w")
		b.WriteString(strconv.FormatUint(k*2654435761%1000003, 36))
		if i%16 == 15 {
			b.WriteByte('\n')
		} else {
			b.WriteByte(' ')
		}
	}
	return b.Bytes()
}

// split cuts text into n pieces at word boundaries.
func split(text []byte, n int) [][]byte {
	parts := make([][]byte, 0, n)
	start := 0
	for i := range n {
		end := max(start, len(text)*(i+1)/n)
		for i < n-1 && end < len(text) && text[end] != ' ' && text[end] != '\n' {
			end++
		}
		parts = append(parts, text[start:end])
		start = end
	}
	return parts
}

// count is the map step: the words of text, counted.
func count(text []byte) counts {
	c := counts{}
	for _, w := range strings.Fields(string(text)) {
		c[w]++
	}
	return c
}

// partition cuts c into n pieces by the word's hash: piece r goes to reducer r+1.
func partition(c counts, n int) []counts {
	out := make([]counts, n)
	for i := range out {
		out[i] = counts{}
	}
	for w, k := range c {
		h := fnv.New32a()
		h.Write([]byte(w))
		out[h.Sum32()%uint32(n)][w] = k
	}
	return out
}

// add is the reduce step: it adds the counts in b to c.
func (c counts) add(b counts) {
	for w, k := range b {
		c[w] += k
	}
}

// encode writes c as lines "word count".
func (c counts) encode() []byte {
	var b bytes.Buffer
	for w, k := range c {
		fmt.Fprintf(&b, "%s %d\n", w, k)
	}
	return b.Bytes()
}

// decode reads what encode wrote.
func decode(data []byte) (counts, error) {
	c := counts{}
	for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if line == "" {
			continue
		}
		w, k, ok := strings.Cut(line, " ")
		n, err := strconv.Atoi(k)
		if !ok || err != nil {
			return nil, fmt.Errorf("bad count line %q", line)
		}
		c[w] += n
	}
	return c, nil
}
