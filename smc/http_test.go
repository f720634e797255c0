package smc_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"sync"
	"testing"

	"github.com/krcore/krcore/smc"
)

type connKey struct{}

// TestHTTP: a net/http server on an SMC listener serves Go clients over
// SMC and curl over TCP at once; each response names the connection's mode
// and echoes the request body whole.
func TestHTTP(t *testing.T) {
	srvAPI, clients := apis(t)
	for name, api := range clients {
		t.Run(name, func(t *testing.T) {
			srvNode := open(t, srvAPI, smc.NodeOptions{})
			cliNode := open(t, api, smc.NodeOptions{})
			ln := listen(t, &smc.Options{Node: srvNode})
			srv := &http.Server{
				ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) },
				Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					body, err := io.ReadAll(r.Body)
					if err != nil {
						http.Error(w, err.Error(), http.StatusBadRequest)
						return
					}
					fmt.Fprintf(w, "%v\n", smc.ModeOf(r.Context().Value(connKey{}).(net.Conn)))
					w.Write(body)
				}),
			}
			go srv.Serve(ln)
			t.Cleanup(func() { srv.Close() })
			url := "http://" + ln.Addr().String() + "/"
			hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return smc.DialContext(ctx, network, addr, &smc.Options{Node: cliNode})
			}}}
			t.Cleanup(hc.CloseIdleConnections)
			body := bytes.Repeat([]byte("smc over http "), 20000) // 280 KB, several buffers' worth
			var wg sync.WaitGroup
			for i := range 4 {
				wg.Add(1)
				go func() { // Go clients: SMC
					defer wg.Done()
					for range 5 {
						resp, err := hc.Post(url, "application/octet-stream", bytes.NewReader(body))
						if err != nil {
							t.Error(err)
							return
						}
						got, err := io.ReadAll(resp.Body)
						resp.Body.Close()
						if want := append([]byte("SMC\n"), body...); err != nil || !bytes.Equal(got, want) {
							t.Errorf("Go client %d: %d bytes (%.20q), %v", i, len(got), got, err)
						}
					}
				}()
			}
			if curl, err := exec.LookPath("curl"); err == nil {
				for i := range 2 {
					wg.Add(1)
					go func() { // curl: TCP fallback on the same port
						defer wg.Done()
						out, err := exec.Command(curl, "-s", "--data-binary", "hello from curl", url).Output()
						want := fmt.Sprintf("TCP: %v\nhello from curl", smc.ReasonPeerNoSMC)
						if err != nil || string(out) != want {
							t.Errorf("curl %d: %q, %v; want %q", i, out, err, want)
						}
					}()
				}
			} else {
				t.Log("no curl: only Go clients checked")
			}
			wg.Wait()
		})
	}
}
