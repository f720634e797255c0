package smc

import (
	"bytes"
	"testing"
)

// FuzzPeerMessages: the control messages a peer sends to a Node's port
// (CDC and buffer moves) never panic the decoders, and what decodes
// encodes back to the same bytes.
func FuzzPeerMessages(f *testing.F) {
	mv := moveMsg{token: 7, off: 4096, size: 1 << 20, name: "smc/1/rmb/2-3/100000/0"}
	f.Add(mv.encode(make([]byte, cdcSlot)))
	cdc := cdcMsg{seq: 1, token: 9, prod: toCursor(1<<33+5, cursorSpan), prodFlags: flagUrgPresent, connFlags: flagMoved}
	f.Add(cdc.encode(make([]byte, cdcSlot)))
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, err := decodeMove(b); err == nil {
			if len(m.name) > maxName {
				t.Fatalf("a move naming %d bytes decoded, more than %d", len(m.name), maxName)
			}
			if got := m.encode(make([]byte, cdcSlot)); !bytes.Equal(got, b) {
				t.Fatalf("move %+v encodes to %x, decoded from %x", m, got, b)
			}
		}
		if m, ok := decodeCDC(b); ok {
			if v := fromCursor(m.prod, cursorSpan, 0); toCursor(v, cursorSpan) != m.prod {
				t.Fatalf("cursor %+v maps to %d and back to %+v", m.prod, v, toCursor(v, cursorSpan))
			}
		}
	})
}
