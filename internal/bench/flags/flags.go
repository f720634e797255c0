// Package flags is krbench's command-line conventions, which its
// subcommands (krbench itself, krbench daemon, krbench pingpong) share: a
// flag set that reports its errors and prints its usage, words mixed with
// flags, and the usage error that makes exit status 2.
package flags

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// ErrUsage marks a command-line mistake (exit status 2).
var ErrUsage = errors.New("usage")

// NewSet is a flag set that reports its errors (rather than exiting)
// and prints usage, then the flags, to stderr.
func NewSet(name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	return fs
}

// ParseMixed parses args, in which words (as isWord tells) and flags may
// mix (krbench demo -n 10, krbench -inproc read-lat -n 5), and returns the
// words: the flag package stops at the first word, so take the words and
// parse what follows them again. A parse error but -h wraps ErrUsage.
func ParseMixed(fs *flag.FlagSet, args []string, isWord func(string) bool) ([]string, error) {
	var words []string
	for {
		for len(args) > 0 && isWord(args[0]) {
			words = append(words, args[0])
			args = args[1:]
		}
		if len(args) == 0 {
			return words, nil
		}
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, fmt.Errorf("%w: %v", ErrUsage, err)
		}
		args = fs.Args()
		if len(args) > 0 && strings.HasPrefix(args[0], "-") {
			// Only after a "--": everything left is words.
			return append(words, args...), nil
		}
	}
}
