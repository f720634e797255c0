package plot

import (
	"bytes"
	"errors"
	"image"
	"image/png"
	"testing"
)

// TestPNG: a chart decodes as a PNG of the chart's size with each series'
// colour on it; a chart without points is ErrEmpty.
func TestPNG(t *testing.T) {
	c := Chart{Title: "connect p99", XLabel: "nodes", YLabel: "usec", Series: []Series{
		{Name: "dc", Points: []Point{{1000, 10}, {2000, 11}, {10000, 12}}},
		{Name: "rc-only", Points: []Point{{1000, 30}, {10000, 35}}},
		{Name: "steep", Points: []Point{{1000, 0}, {2000, 4096}, {5000, 16384}, {10000, 32768}}},
	}}
	var b bytes.Buffer
	if err := c.PNG(&b); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&b)
	if err != nil {
		t.Fatal(err)
	}
	if img.Bounds() != image.Rect(0, 0, width, height) {
		t.Fatalf("bounds %v", img.Bounds())
	}
	seen := map[[3]uint32]bool{}
	for y := range height {
		for x := range width {
			r, g, b, _ := img.At(x, y).RGBA()
			seen[[3]uint32{r >> 8, g >> 8, b >> 8}] = true
		}
	}
	for i := range c.Series {
		p := palette[i]
		if !seen[[3]uint32{uint32(p.R), uint32(p.G), uint32(p.B)}] {
			t.Errorf("series %d's colour is not drawn", i)
		}
	}
	if err := (Chart{Series: []Series{{Name: "none"}}}).PNG(&b); !errors.Is(err, ErrEmpty) {
		t.Errorf("no points: %v, want ErrEmpty", err)
	}
}

// TestLineEnds: a line reaches its end at every slope (a Bresenham step
// that judged the error after moving overshot some and never ended).
func TestLineEnds(t *testing.T) {
	img := image.NewRGBA(image.Rect(0, 0, 200, 200))
	c := image.Pt(100, 100)
	for dx := -90; dx <= 90; dx += 7 {
		for dy := -90; dy <= 90; dy += 3 {
			line(img, c, c.Add(image.Pt(dx, dy)), black)
		}
	}
}
