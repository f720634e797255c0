package core_test

import (
	"log/slog"
	"os"
	"testing"
)

// TestMain turns on debug logging when KRCORE_DEBUG is set.
func TestMain(m *testing.M) {
	if os.Getenv("KRCORE_DEBUG") != "" {
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})))
	}
	os.Exit(m.Run())
}
