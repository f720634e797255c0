package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHostileConfig: a config file or command line a hostile or careless
// user writes is refused with errConfig and an error naming what is wrong,
// and never hangs: stray arguments, a key given twice or in another case,
// a null, a file that is not one JSON object, that is empty, huge, a
// directory, a device or a FIFO.
func TestHostileConfig(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	huge := filepath.Join(dir, "huge.json")
	if err := os.WriteFile(huge, []byte(`{"node": 2`+strings.Repeat(" ", 8<<20)+`}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		file string   // config file body, or "" for none
		args []string // flags (after -config FILE if file is set)
		want []string // in the error
	}{
		{name: "stray argument", args: []string{"extra"}, want: []string{`"extra"`}},
		{name: "stray after flags", args: []string{"-node", "2", "node=3"}, want: []string{`"node=3"`}},
		{name: "stray after file", file: `{"node": 2}`, args: []string{"stray"}, want: []string{`"stray"`}},
		{name: "duplicate key", file: `{"node": 2, "max_vqs": 4, "node": 3}`, want: []string{`"node"`, "twice"}},
		{name: "duplicate duration", file: `{"spin": "1us", "spin": "2us"}`, want: []string{`"spin"`, "twice"}},
		{name: "key in capitals", file: `{"NODE": 5}`, want: []string{`"NODE"`}},
		{name: "key capitalised", file: `{"Spin": "1us"}`, want: []string{`"Spin"`}},
		{name: "key camel case", file: `{"max_VQs": 2}`, want: []string{`"max_VQs"`}},
		{name: "null value", file: `{"node": null}`, want: []string{`"node"`, "null"}},
		{name: "null duration", file: `{"call_timeout": null}`, want: []string{`"call_timeout"`, "null"}},
		{name: "null file", file: `null`, want: []string{"object"}},
		{name: "array file", file: `[{"node": 2}]`, want: []string{"object"}},
		{name: "string file", file: `"node"`, want: []string{"object"}},
		{name: "empty file", file: " \n", want: []string{"empty"}},
		{name: "not JSON", file: "node = 2\n", want: []string{"krcored.json"}},
		{name: "truncated", file: `{"node": 2,`, want: []string{"krcored.json"}},
		{name: "huge file", args: []string{"-config", huge}, want: []string{"huge.json", "larger than"}},
		{name: "missing file", args: []string{"-config", filepath.Join(dir, "none.json")}, want: []string{"none.json"}},
		{name: "directory", args: []string{"-config", dir}, want: []string{dir, "not a regular file"}},
		{name: "device", args: []string{"-config", "/dev/zero"}, want: []string{"/dev/zero", "not a regular file"}},
		{name: "fifo", args: []string{"-config", fifo}, want: []string{fifo, "not a regular file"}},
		{name: "empty config name", args: []string{"-config", ""}, want: nil}, // none: accepted
	} {
		t.Run(c.name, func(t *testing.T) {
			args := c.args
			if c.file != "" {
				args = append([]string{"-config", writeConfig(t, c.file)}, args...)
			}
			done := make(chan error, 1)
			go func() { _, err := parse(args); done <- err }()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("%q: parse still running after 10s", args)
			}
			if c.want == nil {
				if err != nil {
					t.Fatalf("%q: %v", args, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("%q: accepted", args)
			}
			if !errors.Is(err, errConfig) {
				t.Errorf("%q: %v: not errConfig", args, err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q: %v: does not say %q", args, err, w)
				}
			}
		})
	}
}
