package meta_test

import (
	"flag"
	"testing"

	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/verbs"
)

func TestInfoText(t *testing.T) {
	for _, in := range []meta.Info{
		{Addr: "mem:meta", QPN: 0x1234, QKey: 0x5678},
		{Addr: "10.1.2.3:7471", GID: verbs.GID{0xfe, 0x80, 15: 1}, LID: 7, QPN: 1 << 23, QKey: 0x7fffffff},
	} {
		s := in.String()
		out, err := meta.ParseInfo(s)
		if err != nil || out != in {
			t.Fatalf("ParseInfo(%q) = %+v, %v; want %+v", s, out, err, in)
		}
	}
	for _, bad := range []string{"", "addr=x", "qpn=5", "addr=x qpn=abc", "addr=x qpn=5 color=red", "addr=x qpn=5 junk", "addr=x qpn=1 lid=70000"} {
		if _, err := meta.ParseInfo(bad); err == nil {
			t.Errorf("ParseInfo(%q) succeeded", bad)
		}
	}
}

func TestInfoFlag(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var info meta.Info
	fs.TextVar(&info, "meta", meta.Info{}, "MetaServer")
	if err := fs.Parse([]string{"-meta", "addr=h:1 qpn=300 qkey=0x10"}); err != nil {
		t.Fatal(err)
	}
	if info != (meta.Info{Addr: "h:1", QPN: 300, QKey: 16}) {
		t.Fatalf("flag parsed %+v", info)
	}
}
