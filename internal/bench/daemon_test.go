package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/krcore/krcore/internal/perf"
)

// TestDaemonBench runs krbench daemon: the server node and krcored in child
// processes (this test binary again), the embedded node and the daemon's
// client here; every series and the targets' figures come out.
func TestDaemonBench(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	rep := parseTables(t, krbenchProcess(t, "daemon", "-n", "20", "-procs", "2", "-spin", "20us", "-timeout", "10s"))
	for _, test := range []string{testDRead, testDReadOwn, testDWrite, testDSend, testDConnect} {
		r := rep.FindAt(placementCross, test, perf.ModeLat)
		if r == nil || r.LabelRow(seriesEmbedded) == nil || r.LabelRow(seriesDaemon) == nil {
			t.Errorf("%s: no embedded and daemon rows: %+v", test, r)
		}
	}
	checkTargets(t, rep,
		"own node: daemon 8B READ t_typical minus embedded t_typical",
		"warm connect through the daemon t_typical")
	if runtime.GOOS == "linux" && runtime.NumCPU() >= 2 {
		for _, c := range rep.Checks {
			if strings.HasPrefix(c.Name, "cross-core round trip") && c.Value > 0 {
				return
			}
		}
		t.Errorf("no cross-core round trip figure: %+v", rep.Checks)
	}
}

// TestClientDaemon runs krbench -client -daemon: a -keep-runtime server in
// this process, krcored as a child process joined to its MetaServer (this
// binary's krcored role), and the client in a process of its own, whose
// connect and vq tests go through the daemon beside the raw baselines.
func TestClientDaemon(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	addr, out, stop := startServerOut(t, "-keep-runtime", "-timeout", "10s")
	defer stop()
	line, _, _ := strings.Cut(out, "\n")
	info, ok := strings.CutPrefix(line, metaPrefix)
	if !ok {
		t.Fatalf("server printed no MetaServer before listening: %q", out)
	}
	sock := filepath.Join(t.TempDir(), "krcored.sock")
	krcoredProcess(t, sock, "-node", "100", "-meta", info)

	rep := parseTables(t, krbenchProcess(t, "-client", addr, "-daemon", sock, "-n", "20", "-timeout", "10s", "connect", "vq"))
	for _, want := range []struct {
		test string
		mode perf.Mode
		rows []string
	}{
		{testKrConnect, perf.ModeLat, []string{seriesWarm + daemonSuffix, seriesMetaRead, seriesRead8}},
		{testVQRead, perf.ModeLat, []string{seriesVQ + daemonSuffix, seriesQP}},
		{testVQWrite, perf.ModeLat, []string{seriesVQ + daemonSuffix, seriesQP}},
		{testVQSend, perf.ModeLat, []string{seriesVQ + daemonSuffix, seriesQP}},
	} {
		r := rep.FindAt(placementCross, want.test, want.mode)
		if r == nil {
			t.Errorf("no %s %s table", want.test, want.mode)
			continue
		}
		for _, l := range want.rows {
			if row := r.LabelRow(l); row == nil || row.Iterations == 0 {
				t.Errorf("%s: row %s: %+v", want.test, l, row)
			}
		}
		if r.LabelRow(seriesCold) != nil || r.LabelRow(seriesVQ) != nil {
			t.Errorf("%s: an embedded row in a run through the daemon", want.test)
		}
	}
	if r := rep.FindAt(placementCross, testVQRead, perf.ModeBW); r == nil || r.BandwidthLabelRow(seriesVQ+daemonSuffix+medianSuffix) == nil {
		t.Errorf("vq-read bw: no %s row: %+v", seriesVQ+daemonSuffix+medianSuffix, r)
	}
	if r := rep.FindAt(placementCross, testKrRate, perf.ModeBW); r == nil || r.BandwidthLabelRow("1"+daemonSuffix) == nil {
		t.Errorf("krcore-rate: no 1%s row: %+v", daemonSuffix, r)
	}
	checkTargets(t, rep, "cross-process krcore warm connect through krcored t_typical")
}

// krcoredProcess starts this test binary in krbench's krcored role on
// socket sock with args, waits for the socket, and stops the daemon
// (SIGTERM) when t ends.
func krcoredProcess(t *testing.T, sock string, args ...string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, append([]string{childKrcored, "-socket", sock}, args...)...)
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("krcored: %v\nstderr: %s", err, stderr.String())
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) { // it is starting
		if _, err := os.Stat(sock); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("krcored made no socket %s in 10s: %s", sock, stderr.String())
		}
	}
}
