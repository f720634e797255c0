package main

import (
	"errors"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

// The plot's size and margins, in pixels.
const (
	plotW, plotH                       = 960, 540
	marginL, marginR, marginT, marginB = 80, 20, 50, 50
	textScale                          = 2 // each font dot is this many pixels
)

// modeColors are the modes' lines.
var modeColors = map[string]color.RGBA{
	modeRaw:      {200, 40, 40, 255},
	modeEmbedded: {40, 80, 200, 255},
	modeDaemon:   {30, 150, 60, 255},
}

// font is a 3x5 dot font for the plot's labels (what image/png alone
// offers: no text).
var font = map[rune][5]string{
	'0': {"###", "#.#", "#.#", "#.#", "###"}, '1': {".#.", "##.", ".#.", ".#.", "###"},
	'2': {"###", "..#", "###", "#..", "###"}, '3': {"###", "..#", "###", "..#", "###"},
	'4': {"#.#", "#.#", "###", "..#", "..#"}, '5': {"###", "#..", "###", "..#", "###"},
	'6': {"###", "#..", "###", "#.#", "###"}, '7': {"###", "..#", "..#", "..#", "..#"},
	'8': {"###", "#.#", "###", "#.#", "###"}, '9': {"###", "#.#", "###", "..#", "###"},
	'.': {"...", "...", "...", "...", ".#."}, '-': {"...", "...", "###", "...", "..."},
	'/': {"..#", "..#", ".#.", "#..", "#.."}, '(': {".#.", "#..", "#..", "#..", ".#."},
	')': {".#.", "..#", "..#", "..#", ".#."}, ' ': {"...", "...", "...", "...", "..."},
	':': {"...", ".#.", "...", ".#.", "..."}, '+': {"...", ".#.", "###", ".#.", "..."}, ',': {"...", "...", "...", ".#.", "#.."},
	'A': {"###", "#.#", "###", "#.#", "#.#"}, 'B': {"##.", "#.#", "##.", "#.#", "##."},
	'C': {"###", "#..", "#..", "#..", "###"}, 'D': {"##.", "#.#", "#.#", "#.#", "##."},
	'E': {"###", "#..", "##.", "#..", "###"}, 'F': {"###", "#..", "##.", "#..", "#.."},
	'G': {"###", "#..", "#.#", "#.#", "###"}, 'H': {"#.#", "#.#", "###", "#.#", "#.#"},
	'I': {"###", ".#.", ".#.", ".#.", "###"}, 'K': {"#.#", "#.#", "##.", "#.#", "#.#"},
	'L': {"#..", "#..", "#..", "#..", "###"}, 'M': {"#.#", "###", "###", "#.#", "#.#"},
	'N': {"##.", "#.#", "#.#", "#.#", "#.#"}, 'O': {"###", "#.#", "#.#", "#.#", "###"},
	'P': {"###", "#.#", "###", "#..", "#.."}, 'R': {"##.", "#.#", "##.", "#.#", "#.#"},
	'S': {"###", "#..", "###", "..#", "###"}, 'T': {"###", ".#.", ".#.", ".#.", ".#."},
	'U': {"#.#", "#.#", "#.#", "#.#", "###"}, 'W': {"#.#", "#.#", "###", "###", "#.#"},
	'Y': {"#.#", "#.#", ".#.", ".#.", ".#."}, 'X': {"#.#", "#.#", ".#.", "#.#", "#.#"},
	'Z': {"###", "..#", ".#.", "#..", "###"}, 'V': {"#.#", "#.#", "#.#", "#.#", ".#."},
}

// canvas is the image being drawn.
type canvas struct{ *image.RGBA }

func (c canvas) dot(x, y int, col color.RGBA) {
	if image.Pt(x, y).In(c.Bounds()) {
		c.SetRGBA(x, y, col)
	}
}

// line draws from (x0,y0) to (x1,y1), two pixels thick.
func (c canvas) line(x0, y0, x1, y1 int, col color.RGBA) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for {
		c.dot(x0, y0, col)
		c.dot(x0, y0+1, col)
		if x0 == x1 && y0 == y1 {
			return
		}
		if e2 := 2 * e; e2 >= dy {
			e += dy
			x0 += sx
		} else {
			e += dx
			y0 += sy
		}
	}
}

// text writes s (upper-cased) with its top left at (x, y).
func (c canvas) text(x, y int, s string, col color.RGBA) {
	for _, r := range strings.ToUpper(s) {
		g, ok := font[r]
		if !ok {
			g = font[' ']
		}
		for row, bits := range g {
			for k, b := range bits {
				if b != '#' {
					continue
				}
				for i := range textScale {
					for j := range textScale {
						c.dot(x+k*textScale+i, y+row*textScale+j, col)
					}
				}
			}
		}
		x += 4 * textScale
	}
}

func textWidth(s string) int { return len(s) * 4 * textScale }

func abs(v int) int { return max(v, -v) }

func sign(v int) int {
	switch {
	case v > 0:
		return 1
	case v < 0:
		return -1
	}
	return 0
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// writePlot draws every mode's throughput over time (mean over rounds,
// all clients, ops/s per bucket) with the spike marked, as a PNG.
func writePlot(path string, cfg spikeConfig, runs map[string][]modeRun) error {
	series := map[string][]float64{}
	n, top := 0, 0.0
	for _, m := range cfg.Modes {
		var s []float64
		for _, r := range runs[m] {
			for len(s) < len(r.Ops) {
				s = append(s, 0)
			}
			for i, v := range r.Ops {
				s[i] += float64(v) / cfg.Bucket.Seconds() / float64(len(runs[m]))
			}
		}
		series[m] = s
		n = max(n, len(s))
		for _, v := range s {
			top = math.Max(top, v)
		}
	}
	top = niceCeil(top)
	img := canvas{image.NewRGBA(image.Rect(0, 0, plotW, plotH))}
	white, black, grey := color.RGBA{255, 255, 255, 255}, color.RGBA{0, 0, 0, 255}, color.RGBA{200, 200, 200, 255}
	for y := range plotH {
		for x := range plotW {
			img.SetRGBA(x, y, white)
		}
	}
	x0, y0, x1, y1 := marginL, plotH-marginB, plotW-marginR, marginT
	px := func(b float64) int { return x0 + int(b/float64(max(n, 1))*float64(x1-x0)) }
	py := func(v float64) int { return y0 - int(v/top*float64(y0-y1)) }
	for k := 0; k <= 5; k++ { // y grid and labels
		v := top * float64(k) / 5
		img.line(x0, py(v), x1, py(v), grey)
		l := strconv.FormatFloat(v, 'f', 0, 64)
		img.text(x0-8-textWidth(l), py(v)-5, l, black)
	}
	secs := time.Duration(n) * cfg.Bucket
	for t := -cfg.Warm.Truncate(time.Second); t <= secs-cfg.Warm; t += time.Second { // x ticks each second from the spike
		b := float64(t+cfg.Warm) / float64(cfg.Bucket)
		img.line(px(b), y0, px(b), y0+6, black)
		l := strconv.Itoa(int(t / time.Second))
		img.text(px(b)-textWidth(l)/2, y0+10, l, black)
	}
	img.line(x0, y0, x1, y0, black)
	img.line(x0, y0, x0, y1, black)
	spike := px(float64(cfg.Warm / cfg.Bucket))
	for y := y1; y < y0; y += 8 {
		img.line(spike, y, spike, y+3, black)
	}
	img.text(spike+6, y1+4, "SPIKE: +"+strconv.Itoa(cfg.Spike)+" CLIENTS", black)
	img.text(x0, 12, "YCSB "+cfg.Workload+" OPS/S, ALL CLIENTS ("+strconv.Itoa(cfg.Base)+" + "+strconv.Itoa(cfg.Spike)+")", black)
	img.text((x0+x1)/2-textWidth("T (S) FROM SPIKE")/2, plotH-18, "T (S) FROM SPIKE", black)
	for i, m := range cfg.Modes {
		s, col := series[m], modeColors[m]
		for b := 1; b < len(s); b++ {
			img.line(px(float64(b-1)+0.5), py(s[b-1]), px(float64(b)+0.5), py(s[b]), col)
		}
		ly := y1 + 30 + 16*i
		img.line(x1-150, ly+4, x1-120, ly+4, col)
		img.text(x1-110, ly, m, col)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	return errors.Join(png.Encode(f, img.RGBA), f.Close())
}
