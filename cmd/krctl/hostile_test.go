package main

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHostileKrctl: krctl given a bad command line, a socket path with no
// daemon behind it or a socket that is not krcored's fails with an error
// that names what is wrong, within its deadline, never a panic or a hang.
func TestHostileKrctl(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, []byte("not a socket"), 0o600)
	// a SEQPACKET socket that accepts and never answers
	silent := filepath.Join(dir, "silent.sock")
	ln, err := net.Listen("unixpacket", silent)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	// a SEQPACKET socket that hangs up at once
	hangup := filepath.Join(dir, "hangup.sock")
	ln2, err := net.Listen("unixpacket", hangup)
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	go func() {
		for {
			c, err := ln2.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	// a stream socket (not krcored's kind)
	stream := filepath.Join(dir, "stream.sock")
	ln3, err := net.Listen("unix", stream)
	if err != nil {
		t.Fatal(err)
	}
	defer ln3.Close()
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"no command", nil, []string{"usage"}},
		{"unknown command", []string{"stats"}, []string{"usage"}},
		{"unknown list", []string{"list", "mrs"}, []string{"usage"}},
		{"list without what", []string{"list"}, []string{"usage"}},
		{"extra argument", []string{"status", "now"}, []string{"usage"}},
		{"unknown flag", []string{"-jsn", "status"}, []string{"-jsn"}},
		{"missing socket", []string{"-socket", filepath.Join(dir, "none.sock"), "status"}, []string{"none.sock"}},
		{"empty socket", []string{"-socket", "", "status"}, []string{"-socket", "empty"}},
		{"regular file", []string{"-socket", file, "status"}, []string{file}},
		{"directory", []string{"-socket", dir, "status"}, []string{dir}},
		{"stream socket", []string{"-socket", stream, "status"}, []string{stream}},
		{"hangs up", []string{"-socket", hangup, "status"}, []string{hangup}},
		{"never answers", []string{"-socket", silent, "status"}, []string{silent}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- run(ctx, c.args, io.Discard) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("krctl %q still running 8s past its deadline", c.args)
			}
			if err == nil {
				t.Fatalf("krctl %q: no error", c.args)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("krctl %q: %v: does not say %q", c.args, err, w)
				}
			}
		})
	}
}
