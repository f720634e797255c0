package bench

import (
	"io"
	"log/slog"
	"strings"
)

// slogTo makes the runtimes' logger: warnings and errors, as text, to w.
func slogTo(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// logfWriter adapts a logf function to an io.Writer, one call per line.
type logfWriter func(string, ...any)

func (f logfWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		f("%s", line)
	}
	return len(p), nil
}
