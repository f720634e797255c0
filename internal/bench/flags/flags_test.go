package flags

import (
	"errors"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
)

// TestParseMixed: words and flags may come in any order; after "--" all
// is words; a bad flag is a usage error and -h is flag.ErrHelp.
func TestParseMixed(t *testing.T) {
	isWord := func(a string) bool { return !strings.HasPrefix(a, "-") }
	for _, c := range []struct {
		args  []string
		words []string
		n     int
	}{
		{[]string{"demo", "-n", "10"}, []string{"demo"}, 10},
		{[]string{"-n", "5", "read-lat", "write-bw"}, []string{"read-lat", "write-bw"}, 5},
		{[]string{"a", "-n", "7", "b", "--", "-c"}, []string{"a", "b", "-c"}, 7},
		{nil, nil, 1},
	} {
		fs := NewSet("t", "usage\n", io.Discard)
		n := fs.Int("n", 1, "count")
		words, err := ParseMixed(fs, c.args, isWord)
		if err != nil || !slices.Equal(words, c.words) || *n != c.n {
			t.Errorf("%q: words %q, -n %d, %v; want %q, %d", c.args, words, *n, err, c.words, c.n)
		}
	}
	fs := NewSet("t", "usage\n", io.Discard)
	if _, err := ParseMixed(fs, []string{"x", "-nope"}, isWord); !errors.Is(err, ErrUsage) {
		t.Errorf("unknown flag: %v, want ErrUsage", err)
	}
	var out strings.Builder
	fs = NewSet("t", "usage: t [flags]\n", &out)
	fs.Int("n", 1, "count")
	if _, err := ParseMixed(fs, []string{"-h"}, isWord); !errors.Is(err, flag.ErrHelp) || errors.Is(err, ErrUsage) {
		t.Errorf("-h: %v, want flag.ErrHelp and no usage error", err)
	}
	if !strings.HasPrefix(out.String(), "usage: t [flags]\n") || !strings.Contains(out.String(), "-n") {
		t.Errorf("-h printed %q, want the usage, then the flags", out.String())
	}
}
