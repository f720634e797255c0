package client_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/krcore/krcore/daemon/wire"
	"github.com/krcore/krcore/verbs"
)

// TestReports: a client's reports are kept by name, replaced, withdrawn,
// listed across clients by prefix (over several messages when they do
// not fit one), and dropped when their client detaches; bad names,
// bodies that are not JSON or too large, and a client's 17th report are
// refused with errors.
func TestReports(t *testing.T) {
	e := startEnv(t)
	a, b := attach(t, e), attach(t, e)
	ctx := ctxT(t)
	big := `"` + strings.Repeat("x", 40<<10) + `"` // three do not fit one message
	for _, c := range []struct {
		name, body string
	}{{"smc/1", `{"v":1}`}, {"smc/2", big}, {"smc/1", `{"v":2}`}, {"other", `[]`}} {
		if err := a.Report(ctx, c.name, []byte(c.body)); err != nil {
			t.Fatal(c.name, err)
		}
	}
	for i := range 2 {
		if err := b.Report(ctx, fmt.Sprintf("smc/%d", 10+i), []byte(big)); err != nil {
			t.Fatal(err)
		}
	}
	reps, err := b.Reports(ctx, "smc/")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range reps {
		got = append(got, fmt.Sprintf("%d %s %d", r.Client, r.Name, len(r.Body)))
		if r.PID == 0 || r.Age < 0 {
			t.Errorf("report %+v", r)
		}
	}
	want := []string{fmt.Sprintf("%d smc/1 7", a.ID()), fmt.Sprintf("%d smc/2 %d", a.ID(), len(big)),
		fmt.Sprintf("%d smc/10 %d", b.ID(), len(big)), fmt.Sprintf("%d smc/11 %d", b.ID(), len(big))}
	if strings.Join(got, ",") != strings.Join(want, ",") || string(reps[0].Body) != `{"v":2}` {
		t.Fatalf("reports %q, want %q", got, want)
	}

	// Withdrawn, and gone with the client.
	if err := a.Report(ctx, "smc/2", nil); err != nil {
		t.Fatal(err)
	}
	b.Close() // the daemon reclaims b's session soon after
	for {
		reps, err := a.Reports(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, r := range reps {
			names = append(names, r.Name)
		}
		if strings.Join(names, ",") == "other,smc/1" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("after withdrawing and detaching: %q", names)
		}
		time.Sleep(5 * time.Millisecond)
	}

	for _, c := range []struct {
		name, body string
		want       error
	}{
		{"", `{}`, verbs.ErrInvalid},
		{"a b", `{}`, verbs.ErrInvalid},
		{strings.Repeat("n", wire.MaxReportName+1), `{}`, verbs.ErrInvalid},
		{"smc/x", `{not json`, verbs.ErrInvalid},
		{"smc/x", `"` + strings.Repeat("x", wire.MaxReport) + `"`, verbs.ErrLimit},
	} {
		if err := a.Report(ctx, c.name, []byte(c.body)); !errors.Is(err, c.want) {
			t.Errorf("report %.20q %.20q: %v, want %v", c.name, c.body, err, c.want)
		}
	}
	for i := range wire.MaxReports - 2 {
		if err := a.Report(ctx, fmt.Sprintf("n%d", i), []byte(`1`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Report(ctx, "one-too-many", []byte(`1`)); !errors.Is(err, verbs.ErrLimit) {
		t.Errorf("report past %d: %v", wire.MaxReports, err)
	}
	if err := a.Report(ctx, "smc/1", []byte(`3`)); err != nil {
		t.Errorf("replacing at the limit: %v", err)
	}
}
