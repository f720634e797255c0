package meta

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/krcore/krcore/verbs"
)

// Info is what a client needs to reach a MetaServer: the address of its
// device and the UD QP that takes requests. Everything else (table
// address, rkey, DCT) the client learns from the server's Hello reply, so
// Info stays valid for the server's lifetime and fits in a flag.
type Info struct {
	// Addr, GID and LID address the server's port (see verbs.PortAttr).
	Addr string
	GID  verbs.GID
	LID  uint16
	// QPN is the server's UD QP number; QKey its queue key.
	QPN  uint32
	QKey uint32
}

// String is the text form ParseInfo reads back:
// "addr=HOST:PORT qpn=N qkey=N", plus "gid=IPV6 lid=N" when they are set.
func (i Info) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "addr=%s qpn=%d qkey=%#x", i.Addr, i.QPN, i.QKey)
	if i.GID != (verbs.GID{}) {
		fmt.Fprintf(&b, " gid=%s", i.GID)
	}
	if i.LID != 0 {
		fmt.Fprintf(&b, " lid=%d", i.LID)
	}
	return b.String()
}

// ParseInfo parses the String form. qpn is required, and addr unless a gid
// or lid names the port (RoCE and InfiniBand ports have no fabric address).
func ParseInfo(s string) (Info, error) {
	var i Info
	var seen struct{ addr, qpn bool }
	for _, f := range strings.Fields(s) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return Info{}, fmt.Errorf("meta: parse info %q: field %q is not key=value", s, f)
		}
		var err error
		switch k {
		case "addr":
			i.Addr, seen.addr = v, v != ""
		case "qpn":
			i.QPN, err = parseUint32(v, 24)
			seen.qpn = err == nil
		case "qkey":
			i.QKey, err = parseUint32(v, 32)
		case "lid":
			var n uint32
			n, err = parseUint32(v, 16)
			i.LID = uint16(n)
		case "gid":
			i.GID, err = verbs.ParseGID(v)
		default:
			err = fmt.Errorf("unknown key")
		}
		if err != nil {
			return Info{}, fmt.Errorf("meta: parse info %q: %s: %w", s, f, err)
		}
	}
	if !seen.addr && i.GID == (verbs.GID{}) && i.LID == 0 || !seen.qpn {
		return Info{}, fmt.Errorf("meta: parse info %q: qpn and a port (addr, or gid or lid on RoCE/InfiniBand) are required", s)
	}
	return i, nil
}

func parseUint32(v string, bits int) (uint32, error) {
	n, err := strconv.ParseUint(v, 0, bits)
	return uint32(n), err
}

// MarshalText is String, so an Info works with flag.TextVar and encoders.
func (i Info) MarshalText() ([]byte, error) { return []byte(i.String()), nil }

// UnmarshalText is ParseInfo.
func (i *Info) UnmarshalText(b []byte) error {
	v, err := ParseInfo(string(b))
	if err != nil {
		return err
	}
	*i = v
	return nil
}

// endpoint is the server port an AH needs.
func (i Info) endpoint() verbs.Endpoint {
	return verbs.Endpoint{Addr: i.Addr, GID: i.GID, LID: i.LID, QPN: i.QPN}
}
