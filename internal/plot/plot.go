// Package plot draws the benchmarks' figures as PNG line charts with the
// standard library alone (image/png): a title, two labelled axes with
// ticks, one line per series and a legend. Text is a 3x5 dot font of
// digits, capitals and a few signs (lower case is drawn as capitals),
// enough for axis labels, not for prose.
package plot

import (
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// Point is one (x, y) of a series.
type Point struct{ X, Y float64 }

// Series is one line of a chart.
type Series struct {
	Name   string
	Points []Point
}

// Chart is a line chart. The axes span the points (and 0 on the y axis).
type Chart struct {
	Title, XLabel, YLabel string
	Series                []Series
}

// ErrEmpty: a chart with no points has no axes to draw.
var ErrEmpty = errors.New("plot: no points")

// Size and margins, in pixels; each dot of the font is scale pixels.
const (
	width, height                   = 960, 540
	left, right, top, bottom        = 110, 30, 60, 60
	scale                           = 2
	glyphW, glyphH, glyphGap, ticks = 3, 5, 1, 5
)

// palette colours the series in order.
var palette = []color.RGBA{
	{200, 40, 40, 255}, {40, 80, 200, 255}, {30, 150, 60, 255}, {200, 130, 0, 255},
	{140, 40, 170, 255}, {0, 150, 160, 255}, {90, 90, 90, 255}, {220, 60, 160, 255},
}

var (
	black = color.RGBA{0, 0, 0, 255}
	grey  = color.RGBA{220, 220, 220, 255}
)

// WriteFile draws c into a PNG file at path.
func (c Chart) WriteFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := c.PNG(f); err != nil {
		f.Close()
		return fmt.Errorf("plot %s: %w", path, err)
	}
	return f.Close()
}

// PNG draws c as a PNG image onto w.
func (c Chart) PNG(w io.Writer) error {
	lo, hi, ok := c.bounds()
	if !ok {
		return ErrEmpty
	}
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	fill(img, img.Bounds(), color.RGBA{255, 255, 255, 255})
	frame := image.Rect(left, top, width-right, height-bottom)
	toPx := func(p Point) image.Point {
		return image.Pt(frame.Min.X+int(float64(frame.Dx())*(p.X-lo.X)/(hi.X-lo.X)),
			frame.Max.Y-int(float64(frame.Dy())*(p.Y-lo.Y)/(hi.Y-lo.Y)))
	}
	for i := 0; i <= ticks; i++ {
		x := lo.X + (hi.X-lo.X)*float64(i)/ticks
		y := lo.Y + (hi.Y-lo.Y)*float64(i)/ticks
		px, py := toPx(Point{x, lo.Y}).X, toPx(Point{lo.X, y}).Y
		line(img, image.Pt(px, frame.Min.Y), image.Pt(px, frame.Max.Y), grey)
		line(img, image.Pt(frame.Min.X, py), image.Pt(frame.Max.X, py), grey)
		text(img, image.Pt(px-textWidth(num(x))/2, frame.Max.Y+8), num(x), black)
		text(img, image.Pt(frame.Min.X-8-textWidth(num(y)), py-glyphH*scale/2), num(y), black)
	}
	line(img, frame.Min, image.Pt(frame.Min.X, frame.Max.Y), black)
	line(img, image.Pt(frame.Min.X, frame.Max.Y), frame.Max, black)
	text(img, image.Pt((width-textWidth(c.Title))/2, 16), c.Title, black)
	text(img, image.Pt(frame.Min.X+(frame.Dx()-textWidth(c.XLabel))/2, height-24), c.XLabel, black)
	text(img, image.Pt(8, top-24), c.YLabel, black)
	for i, s := range c.Series {
		col := palette[i%len(palette)]
		for k, p := range s.Points {
			at := toPx(p)
			fill(img, image.Rect(at.X-3, at.Y-3, at.X+4, at.Y+4), col)
			if k > 0 {
				line(img, toPx(s.Points[k-1]), at, col)
			}
		}
		y := frame.Min.Y + 10 + i*(glyphH*scale+8)
		fill(img, image.Rect(frame.Min.X+10, y, frame.Min.X+22, y+glyphH*scale), col)
		text(img, image.Pt(frame.Min.X+28, y), s.Name, black)
	}
	return png.Encode(w, img)
}

// bounds spans every point, and 0 on the y axis; a flat span is widened so
// that the axes have length.
func (c Chart) bounds() (lo, hi Point, ok bool) {
	lo, hi = Point{math.Inf(1), 0}, Point{math.Inf(-1), 0}
	for _, s := range c.Series {
		for _, p := range s.Points {
			lo = Point{min(lo.X, p.X), min(lo.Y, p.Y)}
			hi = Point{max(hi.X, p.X), max(hi.Y, p.Y)}
			ok = true
		}
	}
	if hi.X == lo.X {
		lo.X, hi.X = lo.X-1, hi.X+1
	}
	if hi.Y == lo.Y {
		hi.Y = lo.Y + 1
	}
	hi.Y += (hi.Y - lo.Y) * 0.05 // room above the highest point
	return lo, hi, ok
}

// num writes a tick's value in at most 4 significant digits.
func num(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) }

func fill(img *image.RGBA, r image.Rectangle, col color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, col)
		}
	}
}

// line draws from a to b (Bresenham), 2 pixels thick.
func line(img *image.RGBA, a, b image.Point, col color.RGBA) {
	dx, dy := abs(b.X-a.X), -abs(b.Y-a.Y)
	sx, sy := sign(b.X-a.X), sign(b.Y-a.Y)
	e := dx + dy
	for {
		fill(img, image.Rect(a.X, a.Y, a.X+2, a.Y+2), col)
		if a == b {
			return
		}
		e2 := 2 * e // both steps judge the error before either moves
		if e2 >= dy {
			e, a.X = e+dy, a.X+sx
		}
		if e2 <= dx {
			e, a.Y = e+dx, a.Y+sy
		}
	}
}

func abs(v int) int { return max(v, -v) }

func sign(v int) int {
	switch {
	case v < 0:
		return -1
	case v > 0:
		return 1
	}
	return 0
}

func textWidth(s string) int { return len(s) * (glyphW + glyphGap) * scale }

// text writes s with its top left corner at at.
func text(img *image.RGBA, at image.Point, s string, col color.RGBA) {
	for i, r := range strings.ToUpper(s) {
		g := font[r]
		for row, bits := range g {
			for k, b := range bits {
				if b == '#' {
					x, y := at.X+(i*(glyphW+glyphGap)+k)*scale, at.Y+row*scale
					fill(img, image.Rect(x, y, x+scale, y+scale), col)
				}
			}
		}
	}
}

// font is 3x5 dots a glyph; a rune it lacks is drawn as a space.
var font = map[rune][glyphH]string{
	'0': {"###", "#.#", "#.#", "#.#", "###"}, '1': {".#.", "##.", ".#.", ".#.", "###"},
	'2': {"###", "..#", "###", "#..", "###"}, '3': {"###", "..#", "###", "..#", "###"},
	'4': {"#.#", "#.#", "###", "..#", "..#"}, '5': {"###", "#..", "###", "..#", "###"},
	'6': {"###", "#..", "###", "#.#", "###"}, '7': {"###", "..#", "..#", "..#", "..#"},
	'8': {"###", "#.#", "###", "#.#", "###"}, '9': {"###", "#.#", "###", "..#", "###"},
	'.': {"...", "...", "...", "...", ".#."}, '-': {"...", "...", "###", "...", "..."},
	'/': {"..#", "..#", ".#.", "#..", "#.."}, '(': {".#.", "#..", "#..", "#..", ".#."},
	')': {".#.", "..#", "..#", "..#", ".#."}, ':': {"...", ".#.", "...", ".#.", "..."},
	',': {"...", "...", "...", ".#.", "#.."}, '%': {"#.#", "..#", ".#.", "#..", "#.#"},
	'+': {"...", ".#.", "###", ".#.", "..."}, '=': {"...", "###", "...", "###", "..."},
	'_': {"...", "...", "...", "...", "###"}, '<': {"..#", ".#.", "#..", ".#.", "..#"},
	'>': {"#..", ".#.", "..#", ".#.", "#.."},
	'A': {"###", "#.#", "###", "#.#", "#.#"}, 'B': {"##.", "#.#", "##.", "#.#", "##."},
	'C': {"###", "#..", "#..", "#..", "###"}, 'D': {"##.", "#.#", "#.#", "#.#", "##."},
	'E': {"###", "#..", "##.", "#..", "###"}, 'F': {"###", "#..", "##.", "#..", "#.."},
	'G': {"###", "#..", "#.#", "#.#", "###"}, 'H': {"#.#", "#.#", "###", "#.#", "#.#"},
	'I': {"###", ".#.", ".#.", ".#.", "###"}, 'J': {"..#", "..#", "..#", "#.#", "###"},
	'K': {"#.#", "#.#", "##.", "#.#", "#.#"}, 'L': {"#..", "#..", "#..", "#..", "###"},
	'M': {"#.#", "###", "###", "#.#", "#.#"}, 'N': {"##.", "#.#", "#.#", "#.#", "#.#"},
	'O': {"###", "#.#", "#.#", "#.#", "###"}, 'P': {"###", "#.#", "###", "#..", "#.."},
	'Q': {"###", "#.#", "#.#", "###", "..#"}, 'R': {"##.", "#.#", "##.", "#.#", "#.#"},
	'S': {"###", "#..", "###", "..#", "###"}, 'T': {"###", ".#.", ".#.", ".#.", ".#."},
	'U': {"#.#", "#.#", "#.#", "#.#", "###"}, 'V': {"#.#", "#.#", "#.#", "#.#", ".#."},
	'W': {"#.#", "#.#", "###", "###", "#.#"}, 'X': {"#.#", "#.#", ".#.", "#.#", "#.#"},
	'Y': {"#.#", "#.#", ".#.", ".#.", ".#."}, 'Z': {"###", "..#", ".#.", "#..", "###"},
}
