package bench

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/krcore/krcore/internal/bench/flags"
	"github.com/krcore/krcore/provider/ibverbs"
)

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"-bogus"},
		{"-server", "-client", "x"},
		{"-inproc", "-test", "nosuch"},
		{"-inproc", "-mode", "fast"},
		{"-inproc", "-s", "0"},
		{"-inproc", "-s", "8", "-a"},
		{"-inproc", "-n", "-3"},
		{"-inproc", "-tx-depth", "0"},
		{"-inproc", "-atomic-op", "xor"},
		{"-inproc", "-spin", "-1s"},
		{"-inproc", "-timeout", "0s"},
		{"-server", "read-lat"},
		{"client"},
		{"-client", "host:1:2"},
		{"-inproc", "-fabric-addr", "nonsense"},
		{"-inproc", "mesh", "-nodes", "1"},
		{"-inproc", "cluster", "-nodes", "1000"},
		{"-inproc", "vq-fast"},
		{"-inproc", "-daemon", "/tmp/krcored.sock", "vq"},
		{"-client", "h", "-daemon", "/tmp/krcored.sock", "read"},
		{"-client", "h", "-keep-runtime", "vq"},
	} {
		code, stdout, stderr := runKrbench(t, context.Background(), args...)
		if code != 2 {
			t.Errorf("krbench %q: exit %d, want 2 (usage); stderr: %s", args, code, stderr)
		}
		if stdout != "" || !strings.Contains(stderr, "krbench:") {
			t.Errorf("krbench %q: want only a message on stderr; stdout %q stderr %q", args, stdout, stderr)
		}
	}
	if code, _, _ := runKrbench(t, context.Background(), "-h"); code != 0 {
		t.Errorf("-h: exit %d", code)
	}
}

func TestParseArgs(t *testing.T) {
	var discard bytes.Buffer
	cfg, err := parseArgs([]string{"-client", "10.0.0.1", "read-lat", "write_bw"}, &discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.role != roleClient || cfg.server != "10.0.0.1:18515" {
		t.Errorf("role %v server %q", cfg.role, cfg.server)
	}
	if strings.Join(cfg.tests, ",") != "read,write" || strings.Join(cfg.modesOf(testRead), ",") != "lat" ||
		strings.Join(cfg.modesOf(testWrite), ",") != "bw" || cfg.baseline {
		t.Errorf("tests %v modes %v baseline %v", cfg.tests, cfg.modes, cfg.baseline)
	}
	cfg, err = parseArgs([]string{"-inproc", "-test", "read", "-mode", "lat", "-baseline"}, &discard)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cfg.tests, ",") != "raw,read" || strings.Join(cfg.modesOf(testRaw), ",") != "lat" {
		t.Errorf("-baseline with read lat: tests %v modes %v", cfg.tests, cfg.modes)
	}
	cfg, err = parseArgs([]string{"-inproc", "read-lat", "-n", "7", "write-bw", "-s", "64"}, &discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.n != 7 || cfg.size != 64 || strings.Join(cfg.tests, ",") != "read,write" {
		t.Errorf("words between flags: n %d size %d tests %v", cfg.n, cfg.size, cfg.tests)
	}
	cfg, err = parseArgs([]string{"demo", "-n", "5"}, &discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.role != roleDemo || !cfg.baseline || cfg.tests[0] != testRaw || len(cfg.tests) != len(allTests) || cfg.n != 5 {
		t.Errorf("demo: %+v", cfg)
	}
	cfg, err = parseArgs([]string{"-inproc", "-a", "-test", "atomic"}, &discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.sizes(testAtomic, modeBW); len(got) != 1 || got[0] != 8 {
		t.Errorf("atomic sizes with -a = %v, want [8]", got)
	}
	if got := cfg.sizes(testRead, modeLat); len(got) != 23 || got[0] != 2 || got[22] != 8<<20 {
		t.Errorf("-a sizes = %v", got)
	}
	if it, _ := cfg.iters(modeBW, 8<<20); it != 64 {
		t.Errorf("default bw iterations at 8 MiB = %d, want the 512 MiB budget (64)", it)
	}
	cfg, err = parseArgs([]string{"-inproc", "krcore", "-nodes", "3"}, &discard)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cfg.tests, ",") != "cluster,connect,vq,mesh" || cfg.nodes != 3 || cfg.baseline {
		t.Errorf("krcore: tests %v nodes %d baseline %v", cfg.tests, cfg.nodes, cfg.baseline)
	}
	cfg, err = parseArgs([]string{"-client", "h", "vq-lat", "mesh"}, &discard)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cfg.modesOf(testVQ), ",") != "lat" || cfg.baseline || len(cfg.tests) != 2 {
		t.Errorf("vq-lat mesh: tests %v modes %v baseline %v", cfg.tests, cfg.modes, cfg.baseline)
	}
	if addr, err := serverAddr("[::1]"); err != nil || addr != "[::1]:18515" {
		t.Errorf("serverAddr([::1]) = %q, %v", addr, err)
	}
}

// TestProviderFlag: -provider takes soft or ibverbs, ibverbs-only flags
// need ibverbs, and -provider ibverbs is a usage error in a build without
// the rdma tag and for the tests that run only on soft nodes.
func TestProviderFlag(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"-client", "127.0.0.1", "-provider", "nope"}, &out, &errb); code != 2 {
		t.Fatalf("-provider nope: exit %d, want 2 (%s)", code, errb.String())
	}
	if code := run(context.Background(), []string{"-client", "127.0.0.1", "-gid-idx", "1"}, &out, &errb); code != 2 {
		t.Fatalf("-gid-idx on soft: exit %d, want 2", code)
	}
	errb.Reset()
	code := run(context.Background(), []string{"-client", "127.0.0.1", "-provider", "ibverbs", "read-lat"}, &out, &errb)
	if !ibverbs.Built {
		if code != 2 || !strings.Contains(errb.String(), "built without rdma support") {
			t.Fatalf("untagged -provider ibverbs: exit %d, stderr %q; want 2 and the provider's error", code, errb.String())
		}
		return
	}
	for _, args := range [][]string{
		{"-client", "127.0.0.1", "-provider", "ibverbs", "vq"},
		{"-inproc", "-provider", "ibverbs", "read-lat"},
	} {
		if _, err := parseArgs(args, io.Discard); !errors.Is(err, flags.ErrUsage) {
			t.Errorf("%q: err %v, want a usage error", args, err)
		}
	}
	cfg, err := parseArgs([]string{"-client", "127.0.0.1", "-provider", "ibverbs"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, tst := range cfg.tests {
		if tst == testVQ || tst == testMesh || tst == testCluster {
			t.Fatalf("ibverbs default tests %v include %s", cfg.tests, tst)
		}
	}
}

// TestParseLite: -places and -tests pick what krbench lite runs; a name
// not among them, or one given twice, is a usage error.
func TestParseLite(t *testing.T) {
	c, err := parseLite([]string{"-places", "cross", "-tests", "rpc,lock"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.places) != 1 || c.places[0] != placementCross || len(c.tests) != 2 || !c.tests["rpc"] || !c.tests["lock"] {
		t.Errorf("places %q tests %v", c.places, c.tests)
	}
	if c, err = parseLite(nil, io.Discard); err != nil || len(c.places) != 2 || len(c.tests) != len(liteTests) {
		t.Errorf("defaults: %+v, %v", c, err)
	}
	for _, args := range [][]string{
		{"-places", "tcp"}, {"-places", "cross,cross"}, {"-places", ""},
		{"-tests", "rpc,nosuch"}, {"-tests", "read,read"},
	} {
		if _, err := parseLite(args, io.Discard); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}
