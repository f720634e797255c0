package perf

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Mode is the kind of table a Result holds.
type Mode string

// Modes.
const (
	ModeLat Mode = "lat" // latency rows
	ModeBW  Mode = "bw"  // bandwidth rows
)

// Field is one "key : value" line of a table's preamble (perftest prints
// device, transport, depths ... there).
type Field struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Result is one table: a titled set of latency or bandwidth rows.
type Result struct {
	// Title is the centred heading, e.g. "RDMA_Read Latency Test".
	Title string `json:"title"`
	// Test names what was measured ("read", "tcp", "connect" ...) and Mode
	// which table it is; they make results easy to find in JSON.
	Test string `json:"test"`
	Mode Mode   `json:"mode"`
	// Placement says where the two sides ran ("cross-process",
	// "in-process"), so one report can hold both.
	Placement string `json:"placement,omitempty"`
	// Column, if set, names the first column instead of "#bytes"; rows
	// then print their Label there (connect phases).
	Column    string           `json:"column,omitempty"`
	Info      []Field          `json:"info,omitempty"`
	Latency   []LatencyStats   `json:"latency,omitempty"`
	Bandwidth []BandwidthStats `json:"bandwidth,omitempty"`
}

// Report is a whole benchmark run: its tables and derived checks.
type Report struct {
	Tool    string   `json:"tool"`
	Info    []Field  `json:"info,omitempty"`
	Results []Result `json:"results"`
	Checks  []Check  `json:"checks,omitempty"`
}

// Find returns the first result with the given test and mode, or nil.
func (r *Report) Find(test string, mode Mode) *Result {
	return r.FindAt("", test, mode)
}

// FindAt is Find restricted to one placement; "" matches any.
func (r *Report) FindAt(placement, test string, mode Mode) *Result {
	for i := range r.Results {
		if r.Results[i].Test == test && r.Results[i].Mode == mode && (placement == "" || r.Results[i].Placement == placement) {
			return &r.Results[i]
		}
	}
	return nil
}

// LatencyRow returns the row for bytes, or nil.
func (r *Result) LatencyRow(bytes int) *LatencyStats {
	return firstRow(r.Latency, func(l *LatencyStats) bool { return l.Bytes == bytes && l.Label == "" })
}

// BandwidthLabelRow returns the bandwidth row labelled label, or nil.
func (r *Result) BandwidthLabelRow(label string) *BandwidthStats {
	return firstRow(r.Bandwidth, func(b *BandwidthStats) bool { return b.Label == label })
}

// LabelRow returns the latency row labelled label, or nil.
func (r *Result) LabelRow(label string) *LatencyStats {
	return firstRow(r.Latency, func(l *LatencyStats) bool { return l.Label == label })
}

// BandwidthRow returns the row for bytes, or nil.
func (r *Result) BandwidthRow(bytes int) *BandwidthStats {
	return firstRow(r.Bandwidth, func(b *BandwidthStats) bool { return b.Bytes == bytes && b.Label == "" })
}

// firstRow returns a pointer into rows at the first row match accepts, or
// nil: callers may read the row in place.
func firstRow[T any](rows []T, match func(*T) bool) *T {
	for i := range rows {
		if match(&rows[i]) {
			return &rows[i]
		}
	}
	return nil
}

// Separator is the rule perftest draws around its tables.
const Separator = "---------------------------------------------------------------------------------------"

// Column headers, as perftest prints them.
const (
	LatencyHeader   = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"
	BandwidthHeader = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
)

// Preamble keys WriteText adds for Result fields.
const (
	testKey      = "Test"
	placementKey = "Placement"
)

// checksTitle heads the checks section of a text report.
const checksTitle = "Ratios and targets"

// WriteText renders the result as a perftest-shaped table.
func (r *Result) WriteText(w io.Writer) error {
	b := &strings.Builder{}
	fmt.Fprintln(b, Separator)
	fmt.Fprintf(b, "%20s%s\n", "", r.Title)
	// Test and placement lead the preamble so ParseText can restore them.
	if r.Test != "" {
		fmt.Fprintf(b, " %-16s: %s\n", testKey, r.Test)
	}
	if r.Placement != "" {
		fmt.Fprintf(b, " %-16s: %s\n", placementKey, r.Placement)
	}
	for _, f := range r.Info {
		fmt.Fprintf(b, " %-16s: %s\n", f.Key, f.Value)
	}
	fmt.Fprintln(b, Separator)
	switch r.Mode {
	case ModeBW:
		hdr := r.header(BandwidthHeader)
		fmt.Fprintln(b, hdr)
		cols := columnStarts(hdr, bwColumns)
		for _, s := range r.Bandwidth {
			writeRow(b, cols, r.firstCell(s.Bytes, s.Label), strconv.Itoa(s.Iterations), f2(s.PeakMBps), f2(s.AvgMBps),
				strconv.FormatFloat(s.MsgRate, 'f', 6, 64))
		}
	default:
		hdr := r.header(LatencyHeader)
		fmt.Fprintln(b, hdr)
		cols := columnStarts(hdr, latColumns)
		for _, s := range r.Latency {
			writeRow(b, cols, r.firstCell(s.Bytes, s.Label), strconv.Itoa(s.Iterations), f2(s.Min), f2(s.Max), f2(s.Typical), f2(s.Avg),
				f2(s.Stdev), f2(s.P99), f2(s.P999))
		}
	}
	fmt.Fprintln(b, Separator)
	_, err := io.WriteString(w, b.String())
	return err
}

// header is perftest's header line, its first column renamed to r.Column
// if set; the other columns stay where perftest puts them.
func (r *Result) header(perftest string) string {
	if r.Column == "" {
		return perftest
	}
	return " " + pad(r.Column, len("#bytes")) + perftest[len(" #bytes"):]
}

// firstCell is what a row prints in the first column: its size, or its
// label in a labelled table or row.
func (r *Result) firstCell(bytes int, label string) string {
	if r.Column != "" || label != "" {
		return token(label)
	}
	return strconv.Itoa(bytes)
}

// WriteText renders every result, then the checks.
func (rep *Report) WriteText(w io.Writer) error {
	for i := range rep.Results {
		if err := rep.Results[i].WriteText(w); err != nil {
			return err
		}
	}
	if len(rep.Checks) == 0 {
		return nil
	}
	b := &strings.Builder{}
	fmt.Fprintln(b, Separator)
	fmt.Fprintf(b, "%20s%s\n", "", checksTitle)
	fmt.Fprintln(b, Separator)
	width := 0
	for _, c := range rep.Checks {
		width = max(width, len(c.Name))
	}
	for _, c := range rep.Checks {
		fmt.Fprintf(b, " %s : %s", pad(c.Name, width), c.format(c.Value))
		if c.Target != "" {
			verdict := "met"
			if c.Met != nil && !*c.Met {
				verdict = "MISSED"
			}
			fmt.Fprintf(b, "   (target %s: %s)", c.Target, verdict)
		}
		fmt.Fprintln(b)
	}
	fmt.Fprintln(b, Separator)
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON writes the report as one indented JSON document.
func (rep *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// The words that start each column of the headers: values are printed
// left-aligned under them, as perftest does.
var (
	latColumns = []string{"#iterations", "t_min", "t_max", "t_typical", "t_avg", "t_stdev", "99%", "99.9%"}
	bwColumns  = []string{"#iterations", "BW peak", "BW average", "MsgRate"}
)

// columnStarts returns where each column of hdr starts: 1 for the first
// column, then the offsets of words.
func columnStarts(hdr string, words []string) []int {
	cols := []int{1}
	from := 0
	for _, w := range words {
		k := strings.Index(hdr[from:], w)
		if k < 0 { // cannot happen with the headers above
			k = 0
		}
		from += k
		cols = append(cols, from)
		from += len(w)
	}
	return cols
}

// writeRow prints vals left-aligned at cols, always at least one space
// apart so a wide value cannot merge with its neighbour.
func writeRow(b *strings.Builder, cols []int, vals ...string) {
	line := make([]byte, 0, 160)
	for i, v := range vals {
		want := cols[i]
		if i > 0 {
			want = max(want, len(line)+1)
		}
		for len(line) < want {
			line = append(line, ' ')
		}
		line = append(line, v...)
	}
	b.Write(line)
	b.WriteByte('\n')
}

func f2(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

func pad(s string, n int) string {
	if len(s) >= n {
		return s
	}
	return s + strings.Repeat(" ", n-len(s))
}

// token makes a label one whitespace-free word so ParseText can split rows.
func token(s string) string {
	if s == "" {
		return "-"
	}
	return strings.Join(strings.Fields(s), "_")
}

// ErrParse reports text that is not a table WriteText produced.
var ErrParse = errors.New("perf: cannot parse table")

// ParseText reads back the tables and checks that Report.WriteText wrote,
// ignoring any other lines (logs, notes) between tables. Values carry the
// printed precision. Mode is inferred from the header (Test and Placement are
// restored from the preamble); Column from a latency header whose first
// column is not "#bytes".
func ParseText(r io.Reader) (*Report, error) {
	rep := &Report{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("perf: read tables: %w", err)
	}
	// A table is: Separator, title, info..., Separator, header, rows...,
	// Separator. The checks section has no header: Separator, title,
	// Separator, checks..., Separator.
	for i := 0; i < len(lines); i++ {
		if lines[i] != Separator || i+2 >= len(lines) {
			continue
		}
		title := strings.TrimSpace(lines[i+1])
		j := i + 2
		var info []Field
		for j < len(lines) && lines[j] != Separator {
			k, v, ok := strings.Cut(lines[j], ":")
			if !ok {
				return nil, fmt.Errorf("%w: line %d: %q is not \"key : value\"", ErrParse, j+1, lines[j])
			}
			info = append(info, Field{Key: strings.TrimSpace(k), Value: strings.TrimSpace(v)})
			j++
		}
		if j+1 >= len(lines) {
			return nil, fmt.Errorf("%w: table %q ends early", ErrParse, title)
		}
		j++ // the separator after the preamble
		if title == checksTitle {
			for ; j < len(lines) && lines[j] != Separator; j++ {
				c, err := parseCheck(lines[j])
				if err != nil {
					return nil, fmt.Errorf("%w: line %d: %v", ErrParse, j+1, err)
				}
				rep.Checks = append(rep.Checks, c)
			}
			i = j
			continue
		}
		res := Result{Title: title}
		for _, f := range info {
			switch f.Key {
			case testKey:
				res.Test = f.Value
			case placementKey:
				res.Placement = f.Value
			default:
				res.Info = append(res.Info, f)
			}
		}
		hdr := lines[j]
		switch {
		case strings.HasSuffix(hdr, BandwidthHeader[len(" #bytes"):]):
			res.Mode = ModeBW
			res.Column = firstColumn(hdr, BandwidthHeader)
		case strings.HasSuffix(hdr, LatencyHeader[len(" #bytes"):]):
			res.Mode = ModeLat
			res.Column = firstColumn(hdr, LatencyHeader)
		default:
			return nil, fmt.Errorf("%w: line %d: unknown table header %q", ErrParse, j+1, hdr)
		}
		for j++; j < len(lines) && lines[j] != Separator; j++ {
			f := strings.Fields(lines[j])
			var err error
			if res.Mode == ModeBW {
				var s BandwidthStats
				s, err = parseBW(f, res.Column != "")
				res.Bandwidth = append(res.Bandwidth, s)
			} else {
				var s LatencyStats
				s, err = parseLat(f, res.Column != "")
				res.Latency = append(res.Latency, s)
			}
			if err != nil {
				return nil, fmt.Errorf("%w: line %d: %v", ErrParse, j+1, err)
			}
		}
		if j == len(lines) {
			return nil, fmt.Errorf("%w: table %q has no closing rule", ErrParse, title)
		}
		rep.Results = append(rep.Results, res)
		i = j
	}
	return rep, nil
}

// firstColumn returns the name of hdr's first column if it is not the
// standard header's "#bytes".
func firstColumn(hdr, standard string) string {
	col := strings.TrimSpace(hdr[:len(hdr)-len(standard)+len(" #bytes")])
	if col == "#bytes" {
		return ""
	}
	return col
}

func parseLat(f []string, labelled bool) (LatencyStats, error) {
	var s LatencyStats
	if len(f) != 9 {
		return s, fmt.Errorf("latency row has %d fields, want 9", len(f))
	}
	if labelled {
		s.Label = f[0]
	} else {
		n, err := strconv.Atoi(f[0])
		if err != nil {
			return s, fmt.Errorf("#bytes %q: %w", f[0], err)
		}
		s.Bytes = n
	}
	n, err := strconv.Atoi(f[1])
	if err != nil {
		return s, fmt.Errorf("#iterations %q: %w", f[1], err)
	}
	s.Iterations = n
	dst := []*float64{&s.Min, &s.Max, &s.Typical, &s.Avg, &s.Stdev, &s.P99, &s.P999}
	for k, p := range dst {
		if *p, err = strconv.ParseFloat(f[2+k], 64); err != nil {
			return s, fmt.Errorf("column %d %q: %w", 3+k, f[2+k], err)
		}
	}
	return s, nil
}

func parseBW(f []string, labelled bool) (BandwidthStats, error) {
	var s BandwidthStats
	if len(f) != 5 {
		return s, fmt.Errorf("bandwidth row has %d fields, want 5", len(f))
	}
	var err error
	if labelled {
		s.Label = f[0]
	} else if s.Bytes, err = strconv.Atoi(f[0]); err != nil {
		return s, fmt.Errorf("#bytes %q: %w", f[0], err)
	}
	if s.Iterations, err = strconv.Atoi(f[1]); err != nil {
		return s, fmt.Errorf("#iterations %q: %w", f[1], err)
	}
	for k, p := range []*float64{&s.PeakMBps, &s.AvgMBps, &s.MsgRate} {
		if *p, err = strconv.ParseFloat(f[2+k], 64); err != nil {
			return s, fmt.Errorf("column %d %q: %w", 3+k, f[2+k], err)
		}
	}
	if s.MsgRate > 0 {
		s.Seconds = float64(s.Iterations) / (s.MsgRate * 1e6)
	}
	return s, nil
}

// parseCheck reads " NAME : VALUE[x| UNIT]   (target T: met|MISSED)".
func parseCheck(line string) (Check, error) {
	var c Check
	rest := line
	if k := strings.Index(rest, "   (target "); k >= 0 {
		tail := strings.TrimSuffix(rest[k+len("   (target "):], ")")
		t, verdict, ok := strings.Cut(tail, ": ")
		if !ok || (verdict != "met" && verdict != "MISSED") {
			return c, fmt.Errorf("check target %q", tail)
		}
		met := verdict == "met"
		c.Target, c.Met = t, &met
		rest = rest[:k]
	}
	k := strings.LastIndex(rest, " : ")
	if k < 0 {
		return c, fmt.Errorf("check %q has no \" : \"", line)
	}
	c.Name = strings.TrimSpace(rest[:k])
	v := strings.TrimSpace(rest[k+3:])
	num, unit, _ := strings.Cut(v, " ")
	if strings.HasSuffix(num, "x") && unit == "" {
		num, unit = strings.TrimSuffix(num, "x"), "x"
	}
	var err error
	if c.Value, err = strconv.ParseFloat(num, 64); err != nil {
		return c, fmt.Errorf("check value %q: %w", v, err)
	}
	c.Unit = unit
	return c, nil
}

// DurationText is d.String() in ASCII ("200us", not "200µs"): tables should
// survive any terminal and grep.
func DurationText(d time.Duration) string { return strings.ReplaceAll(d.String(), "µ", "u") }
