package daemon

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/krcore/krcore/core"
	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/meta"
	"github.com/krcore/krcore/verbs"
)

// TestEncodeStatusFits: a status too large for a message loses meta cache
// entries first, then QP rows, and says how many; one that cannot fit even
// then fails with ErrLimit.
func TestEncodeStatusFits(t *testing.T) {
	st := wire.Status{Node: 1}
	for i := range 1000 {
		st.MetaEntries = append(st.MetaEntries, meta.CacheEntry{Node: uint64(i + 1), Addr: "127.0.0.1:12345", DCTNum: 7, Version: 3})
	}
	for i := range 100 {
		st.QPs = append(st.QPs, wire.QPStatus{Type: string(core.QPTypeRC), QPN: uint32(i + 1), Peer: 2, State: string(core.QPReady)})
	}
	all, err := encodeStatus(st, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		limit        int
		metaCut, qps bool
	}{{len(all), false, false}, {len(all) / 2, true, false}, {4000, true, true}} {
		b, err := encodeStatus(st, c.limit)
		if err != nil {
			t.Fatal(c.limit, err)
		}
		var got wire.Status
		if err := json.Unmarshal(b, &got); err != nil || len(b) > c.limit {
			t.Fatalf("limit %d: %d bytes, %v", c.limit, len(b), err)
		}
		if len(got.MetaEntries)+got.MetaOmitted != 1000 || len(got.QPs)+got.QPsOmitted != 100 ||
			(got.MetaOmitted > 0) != c.metaCut || (got.QPsOmitted > 0) != c.qps || c.qps && len(got.MetaEntries) != 0 {
			t.Errorf("limit %d: %d entries (%d omitted), %d QPs (%d omitted)", c.limit, len(got.MetaEntries), got.MetaOmitted, len(got.QPs), got.QPsOmitted)
		}
		if len(got.MetaEntries) > 0 && got.MetaEntries[0].Node != 1 {
			t.Errorf("limit %d: the first entries were cut", c.limit)
		}
	}
	if _, err := encodeStatus(st, 100); !errors.Is(err, verbs.ErrLimit) {
		t.Errorf("status in 100 bytes: %v", err)
	}
}

// TestQPStatusShape: the status document lists the runtime's shared QPs
// with every field of core.PoolQP under the same keys, so krctl -json list
// qps reads as the runtime's rows; a field added to core.PoolQP and not to
// wire.QPStatus fails here.
func TestQPStatusShape(t *testing.T) {
	qps := []core.PoolQP{{Type: core.QPTypeRC, QPN: 7, Peer: 3, RemoteQPN: 9, State: core.QPDraining, VQs: 2, InFlight: 4,
		Queued: 5, Posted: 6}}
	want, err := json.Marshal(qps)
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(qpStatuses(qps))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("status rows %s, runtime rows %s", got, want)
	}
	if b, _ := json.Marshal(qpStatuses(nil)); string(b) != "[]" {
		t.Errorf("no QPs encode as %s, want []", b)
	}
}

// TestStatusVisibleTo: through OpStatus root and the daemon's owner see
// every client; another user sees its own clients in full and the others
// only counted, none of their export names, pids or queues.
func TestStatusVisibleTo(t *testing.T) {
	st := wire.Status{Node: 1, Clients: []wire.ClientStatus{
		{ID: 1, PID: 11, UID: 1000, Exports: []string{"alice-secret"}, VQs: []wire.VQStatus{{ID: 5, Node: 2, Port: 7}}},
		{ID: 2, PID: 22, UID: 1001, Exports: []string{"bob-table"}},
		{ID: 3, PID: 33, UID: 1000},
	}}
	for _, c := range []struct {
		uid, owner uint32
		ids        []uint64
		hidden     int
	}{
		{0, 999, []uint64{1, 2, 3}, 0},
		{999, 999, []uint64{1, 2, 3}, 0},
		{1000, 999, []uint64{1, 3}, 1},
		{1001, 999, []uint64{2}, 2},
		{1002, 999, nil, 3},
	} {
		got := visibleTo(st, c.uid, c.owner)
		var ids []uint64
		for _, x := range got.Clients {
			ids = append(ids, x.ID)
		}
		if !slices.Equal(ids, c.ids) || got.ClientsHidden != c.hidden {
			t.Errorf("uid %d: clients %v, %d hidden; want %v, %d hidden", c.uid, ids, got.ClientsHidden, c.ids, c.hidden)
		}
		if b, _ := json.Marshal(got); c.uid == 1001 && (strings.Contains(string(b), "alice-secret") || strings.Contains(string(b), `"pid":11`)) {
			t.Errorf("uid 1001 sees another user's client: %s", b)
		}
	}
	if len(st.Clients) != 3 {
		t.Errorf("visibleTo changed its argument's clients: %d left", len(st.Clients))
	}
}

// TestReportsVisibleTo: OpReports shows a user other than root and the
// daemon's owner only its own user's clients' reports.
func TestReportsVisibleTo(t *testing.T) {
	all := func() []wire.Report {
		return []wire.Report{{Client: 1, UID: 1000, Name: "smc/1"}, {Client: 2, UID: 1001, Name: "smc/2"}, {Client: 3, UID: 1000, Name: "smc/3"}}
	}
	for _, c := range []struct {
		uid     uint32
		clients []uint64
	}{{0, []uint64{1, 2, 3}}, {999, []uint64{1, 2, 3}}, {1000, []uint64{1, 3}}, {1001, []uint64{2}}, {1002, nil}} {
		var got []uint64
		for _, r := range reportsVisibleTo(all(), c.uid, 999) {
			got = append(got, r.Client)
		}
		if !slices.Equal(got, c.clients) {
			t.Errorf("uid %d sees the reports of clients %v, want %v", c.uid, got, c.clients)
		}
	}
}
