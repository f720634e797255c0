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
