package server_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/server"
)

// startFront serves h as both the API and the proxy of a Front with limits
// l, on loopback, until the test ends; it returns both addresses.
func startFront(t *testing.T, l server.HTTPLimits) (api, proxy string) {
	t.Helper()
	f, err := server.ListenFront("127.0.0.1:0", "127.0.0.1:0", server.ProxyTLS{})
	if err != nil {
		t.Fatal(err)
	}
	f.Limits = l
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan [2]string, 1)
	done := make(chan error, 1)
	go func() {
		done <- f.Serve(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)), "test", h, h, func(a, p string) { ready <- [2]string{a, p} })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	addrs := <-ready
	return addrs[0], addrs[1]
}

// dialFrom connects to addr from the loopback address src (127.0.0.0/8
// is all local on Linux: two sources without a second host).
func dialFrom(src, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	return d.Dial("tcp", addr)
}

// get sends one keep-alive request on c and reads its answer.
func get(c net.Conn, header string) (*http.Response, error) {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n%s\r\n", header); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp, nil
}

// closedWithin reports whether the server ends c (EOF or reset) within d.
func closedWithin(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// TestIdleConnectionsAreClosed: a keep-alive connection that sends no next
// request is closed after the idle timeout, on the API and the proxy:
// otherwise idle keyless connections stay open for ever.
func TestIdleConnectionsAreClosed(t *testing.T) {
	const idle = 300 * time.Millisecond
	api, proxy := startFront(t, server.HTTPLimits{IdleTimeout: idle})
	for _, addr := range []string{api, proxy} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if resp, err := get(c, ""); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: first request: %v %v", addr, resp, err)
		}
		start := time.Now()
		if !closedWithin(c, 10*time.Second) {
			t.Fatalf("%s: idle keep-alive connection still open after 10 s (idle timeout %v)", addr, idle)
		}
		if took := time.Since(start); took < idle/2 {
			t.Errorf("%s: closed after %v, before the idle timeout of %v", addr, took, idle)
		}
	}
}

// TestConnCapPerSource: a source at its connection cap gets further
// connections closed at once, while another source's requests are served
// (hundreds of idle connections of one client must not starve keyed
// requests); a closed connection gives its slot back.
func TestConnCapPerSource(t *testing.T) {
	const limit = 8
	api, proxy := startFront(t, server.HTTPLimits{MaxConnsPerIP: limit})
	for _, addr := range []string{api, proxy} {
		var hog []net.Conn
		for range limit {
			c, err := dialFrom("127.0.0.1", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			hog = append(hog, c)
		}
		// Each of them answers: they hold their slots.
		for _, c := range hog {
			if resp, err := get(c, ""); err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: request within the cap: %v %v", addr, resp, err)
			}
		}
		// The reset may already come with the connect.
		if over, err := dialFrom("127.0.0.1", addr); err == nil {
			if _, err := get(over, ""); err == nil {
				t.Errorf("%s: connection %d of one source was served; want it closed at once (cap %d)", addr, limit+1, limit)
			}
			over.Close()
		}

		// Another source, up to its own cap at once, is unaffected.
		var wg sync.WaitGroup
		errs := make(chan error, limit)
		for range limit {
			wg.Go(func() {
				c, err := dialFrom("127.0.0.2", addr)
				if err != nil {
					errs <- err
					return
				}
				defer c.Close()
				if resp, err := get(c, ""); err != nil || resp.StatusCode != http.StatusOK {
					errs <- fmt.Errorf("request from 127.0.0.2: %v %v", resp, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("%s: %v", addr, err)
		}

		// A closed connection frees its slot (the server sees the close
		// when it reads: poll).
		hog[0].Close()
		deadline := time.Now().Add(30 * time.Second)
		for {
			c, err := dialFrom("127.0.0.1", addr)
			if err == nil {
				var resp *http.Response
				resp, err = get(c, "")
				c.Close()
				if err == nil && resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: after closing one of its connections, the source still cannot connect: %v", addr, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// TestOversizedHeaders: headers over the limit (64 KiB by default) get 431;
// below it, the request is served.
func TestOversizedHeaders(t *testing.T) {
	api, _ := startFront(t, server.HTTPLimits{})
	for _, tt := range []struct {
		size int
		want int
	}{
		{32 << 10, http.StatusOK},
		{200 << 10, http.StatusRequestHeaderFieldsTooLarge},
	} {
		c, err := net.Dial("tcp", api)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := get(c, "X-Big: "+strings.Repeat("a", tt.size)+"\r\n")
		c.Close()
		if err != nil {
			t.Fatalf("%d KiB header: %v", tt.size>>10, err)
		}
		if resp.StatusCode != tt.want {
			t.Errorf("%d KiB header: got %d, want %d", tt.size>>10, resp.StatusCode, tt.want)
		}
	}
}
