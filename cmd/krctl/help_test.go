package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"testing"
)

// TestHelp: -h ends run with flag.ErrHelp, which main treats as success
// (exit 0) after the flag package printed the usage.
func TestHelp(t *testing.T) {
	if err := run(context.Background(), []string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("run -h: %v, want flag.ErrHelp", err)
	}
}
