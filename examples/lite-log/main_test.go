package main

import (
	"context"
	"io"
	"os"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/liteapp"
)

func TestMain(m *testing.M) {
	liteapp.RunWorker("lite-log", appender) // a worker process a test started
	os.Exit(m.Run())
}

// TestLog: 3 appender processes append concurrently, through lite and
// through net/rpc; each log holds every record exactly once, whole.
func TestLog(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := config{appenders: 3, records: 300, size: 32, rounds: 1, impls: []string{"lite", "rpc"}}
	med, err := run(ctx, cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, impl := range cfg.impls {
		if r, ok := med[impl]; !ok || check(r.log, cfg) != nil || r.took <= 0 {
			t.Errorf("%s: %v", impl, check(r.log, cfg))
		}
	}
}

// TestCheck: check refuses a log with a lost, doubled or torn record.
func TestCheck(t *testing.T) {
	cfg := config{appenders: 2, records: 2, size: 16}
	log := make([]byte, 0, 64)
	for i := 1; i <= 2; i++ {
		for seq := range 2 {
			rec := make([]byte, 16)
			record(rec, i, seq)
			log = append(log, rec...)
		}
	}
	if err := check(log, cfg); err != nil {
		t.Fatal(err)
	}
	doubled := append(append([]byte{}, log[:48]...), log[:16]...)
	torn := append([]byte{}, log...)
	torn[40] ^= 1
	for name, bad := range map[string][]byte{"lost": log[:48], "doubled": doubled, "torn": torn} {
		if check(bad, cfg) == nil {
			t.Errorf("%s: check passed", name)
		}
	}
}
