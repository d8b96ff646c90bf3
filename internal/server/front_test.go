package server_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/server"
)

// TestFrontHTTPS: with a domain, the proxy also serves HTTPS with a
// certificate of *.<domain> from the local CA made in the CA dir; a client
// that trusts only ca.pem reaches <port>-<id>.<domain>, the domain clients
// are told carries the HTTPS port, and the plain proxy still answers.
func TestFrontHTTPS(t *testing.T) {
	dir := t.TempDir()
	f, err := server.ListenFront("127.0.0.1:0", "127.0.0.1:0", server.ProxyTLS{Domain: "agentenv.localhost", Listen: "127.0.0.1:0", CADir: dir})
	if err != nil {
		t.Fatal(err)
	}
	a := f.Addrs()
	_, port, _ := net.SplitHostPort(a.ProxyTLS)
	if want := "agentenv.localhost:" + port; f.Domain != want {
		t.Errorf("domain %q, want %q", f.Domain, want)
	}
	if f.CAFile != filepath.Join(dir, "ca.pem") {
		t.Errorf("CA file %q, want %s", f.CAFile, filepath.Join(dir, "ca.pem"))
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "host "+r.Host) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		done <- f.Serve(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)), "test", h, h, func(string, string) { close(ready) })
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	<-ready

	pem, err := os.ReadFile(f.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	// Resolve every name to the HTTPS listener (the test sends traffic
	// to loopback only, whatever nsswitch says).
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, a.ProxyTLS)
		},
	}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	host := "8000-i0123456789abcdef0123." + f.Domain
	resp, err := c.Get("https://" + host + "/x")
	if err != nil {
		t.Fatalf("https://%s with only ca.pem trusted: %v", host, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "host "+host {
		t.Errorf("answer %q, want %q", b, "host "+host)
	}
	if resp.TLS == nil || resp.TLS.NegotiatedProtocol == "h2" {
		t.Errorf("TLS state %+v: want HTTP/1.1 over TLS (the proxy streams and upgrades)", resp.TLS)
	}
	// A name outside the domain gets no certificate that verifies.
	if _, err := c.Get("https://example.com/"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("https://example.com through the proxy: err %v, want a certificate error", err)
	}
	resp, err = http.Get("http://" + a.Proxy + "/")
	if err != nil {
		t.Fatalf("plain proxy: %v", err)
	}
	resp.Body.Close()
}

// TestFrontTLSFlags: bad combinations are refused before anything
// listens, saying what to give.
func TestFrontTLSFlags(t *testing.T) {
	for _, c := range []struct {
		name string
		t    server.ProxyTLS
		want string
	}{
		{"cert without domain", server.ProxyTLS{CertFile: "c.pem", KeyFile: "k.pem"}, "need --domain"},
		{"cert without key", server.ProxyTLS{Domain: "a.localhost", Listen: "127.0.0.1:0", CertFile: "c.pem"}, "give both"},
		{"no certificate, no CA dir", server.ProxyTLS{Domain: "a.localhost", Listen: "127.0.0.1:0"}, "--ca-dir"},
		{"domain with a port", server.ProxyTLS{Domain: "a.localhost:3443", Listen: "127.0.0.1:0", CADir: t.TempDir()}, "DNS name only"},
		{"missing cert file", server.ProxyTLS{Domain: "a.localhost", Listen: "127.0.0.1:0", CertFile: "/nonexistent/c.pem", KeyFile: "/nonexistent/k.pem"}, "no such file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, err := server.ListenFront("127.0.0.1:0", "127.0.0.1:0", c.t)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err %v, want one containing %q", err, c.want)
			}
			if f != nil {
				t.Error("a Front came back with the error")
			}
		})
	}
}
