package envdclient_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/envd"
	"github.com/agentenv/agentenv/internal/envdclient"
)

// serve starts an envd handler with token and returns its target.
func serve(t *testing.T, token string) envdclient.Target {
	t.Helper()
	s := httptest.NewServer(envd.New(envd.Config{AccessToken: token}).Handler())
	t.Cleanup(s.Close)
	return envdclient.Target{Addr: strings.TrimPrefix(s.URL, "http://"), Token: token}
}

func TestWait(t *testing.T) {
	c := envdclient.New(nil, nil)
	if err := c.Wait(context.Background(), serve(t, "tok")); err != nil {
		t.Errorf("Wait on a serving envd: got %v, want nil", err)
	}
	// Nothing listens: Wait gives up with ctx and says why.
	down := httptest.NewServer(http.NotFoundHandler())
	addr := strings.TrimPrefix(down.URL, "http://")
	down.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := c.Wait(ctx, envdclient.Target{Addr: addr}); err == nil || !strings.Contains(err.Error(), "last error") || !strings.Contains(err.Error(), "attempts failed; the first: ") {
		t.Errorf("Wait on nothing: got %v, want an error with the last and first failures", err)
	}
}

// TestInitRekeys: after Init, envd takes the new token and refuses the old.
func TestInitRekeys(t *testing.T) {
	c := envdclient.New(nil, nil)
	old := serve(t, "old")
	ctx := context.Background()
	if err := c.Init(ctx, old, "new", map[string]string{"A": "1"}); err != nil {
		t.Fatalf("Init: %v", err)
	}
	if err := c.Init(ctx, old, "newer", nil); err == nil || !strings.Contains(err.Error(), "HTTP 401") {
		t.Errorf("Init with the old token: got %v, want HTTP 401", err)
	}
	if _, err := c.Changes(ctx, old, time.Now()); err == nil || !strings.Contains(err.Error(), "HTTP 401") {
		t.Errorf("Changes with the old token: got %v, want HTTP 401", err)
	}
}

// TestWaitHoldsAcceptedConnection: an envd that listens before it serves
// (its start-up runs after the listen) is waited for on the connection the
// network stack accepted, not polled again with new connections.
func TestWaitHoldsAcceptedConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// Requests, not connections: on a loaded host the first connect can
	// miss its 50 ms deadline in Go while the kernel completed it, and
	// Wait then opens a second one without ever writing on the first.
	// What must not happen is a second request.
	var requests atomic.Int32
	go func() {
		// Nothing accepts for longer than Wait's first connect deadline.
		time.Sleep(300 * time.Millisecond)
		srv := &http.Server{
			Handler: envd.New(envd.Config{}).Handler(),
			ConnState: func(_ net.Conn, s http.ConnState) {
				if s == http.StateActive {
					requests.Add(1)
				}
			},
		}
		srv.Serve(ln)
	}()
	c := envdclient.New(nil, nil)
	if err := c.Wait(context.Background(), envdclient.Target{Addr: ln.Addr().String()}); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if n := requests.Load(); n != 1 {
		t.Errorf("Wait sent %d requests, want 1 (on the connection held until envd served)", n)
	}
}

// TestInitWaitsForEnvd: Init on a restored sandbox needs no Wait first: a
// refused connect is tried again until envd listens, then the one request
// is sent; with nothing listening it gives up with ctx and says why.
func TestInitWaitsForEnvd(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // refused until the server below listens again
	var requests atomic.Int32
	handler := envd.New(envd.Config{AccessToken: "old"}).Handler()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		handler.ServeHTTP(w, r)
	})}
	t.Cleanup(func() { srv.Close() })
	go func() {
		time.Sleep(200 * time.Millisecond)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("listen again on %s: %v", addr, err)
			return
		}
		srv.Serve(ln)
	}()
	c := envdclient.New(nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Init(ctx, envdclient.Target{Addr: addr, Token: "old"}, "new", nil); err != nil {
		t.Fatalf("Init while envd comes up: %v", err)
	}
	if n := requests.Load(); n != 1 {
		t.Errorf("Init sent %d requests, want 1", n)
	}
	if err := c.Wait(ctx, envdclient.Target{Addr: addr, Token: "new"}); err != nil {
		t.Errorf("Wait after Init: %v", err)
	}
	if err := c.Init(ctx, envdclient.Target{Addr: addr, Token: "new"}, "newer", nil); err != nil {
		t.Errorf("Init with the new token: %v", err)
	}

	down, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	ln2, _ := net.Listen("tcp", "127.0.0.1:0")
	gone := ln2.Addr().String()
	ln2.Close()
	if err := c.Init(down, envdclient.Target{Addr: gone, Token: "x"}, "y", nil); err == nil || !strings.Contains(err.Error(), "attempts failed; the first: ") {
		t.Errorf("Init on nothing: got %v, want an error with the last and first failures", err)
	}
}
