package proxy_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/envd"
	"github.com/agentenv/agentenv/internal/proxy"
)

// tokenResolver routes sandboxes to backends and knows their envd tokens.
type tokenResolver struct {
	fakeResolver
	tokens map[string]string // sandbox ID → envd token
}

func (r *tokenResolver) FindByToken(match func(string) bool) (string, bool) {
	for id, tok := range r.tokens {
		if match(tok) {
			return id, true
		}
	}
	return "", false
}

// signedURL is what E2B's SDK makes with E2B_SANDBOX_URL set: the proxy's
// URL, /files, and a signature that names no sandbox.
func signedURL(base, path, op, user, token string, exp int64) string {
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("username", user)
	}
	e := ""
	if exp != 0 {
		e = strconv.FormatInt(exp, 10)
		q.Set("signature_expiration", e)
	}
	q.Set("signature", envd.FileSignature(path, op, user, token, e))
	return base + "/files?" + q.Encode()
}

// TestSignedFileURLWithoutSandbox: a signed /files URL without headers or
// a sandbox host goes to the sandbox whose token signed it, with the same
// operation; one no sandbox signed is refused with envd's text.
func TestSignedFileURLWithoutSandbox(t *testing.T) {
	hit := func(name string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			json.NewEncoder(w).Encode(map[string]string{"sandbox": name, "method": r.Method, "query": r.URL.RawQuery})
		})
	}
	a, b := httptest.NewServer(hit("a")), httptest.NewServer(hit("b"))
	defer a.Close()
	defer b.Close()
	r := &tokenResolver{
		fakeResolver: fakeResolver{boxes: map[string]fakeBox{
			"ia": {addr: a.Listener.Addr().String(), gone: make(chan struct{})},
			"ib": {addr: b.Listener.Addr().String(), gone: make(chan struct{})},
		}},
		tokens: map[string]string{"ia": "token-a", "ib": "token-b"},
	}
	ps := httptest.NewServer(proxy.New(r, slog.New(slog.NewTextHandler(io.Discard, nil))))
	defer ps.Close()
	exp := time.Now().Add(time.Minute).Unix()

	tests := []struct {
		name, method, url string
		status            int
		sandbox           string
	}{
		{"download signed by a", "GET", signedURL(ps.URL, "/tmp/x", "read", "user", "token-a", exp), 200, "a"},
		{"download signed by b, no user, no expiry", "GET", signedURL(ps.URL, "/tmp/x", "read", "", "token-b", 0), 200, "b"},
		{"upload signed by b", "POST", signedURL(ps.URL, "/tmp/y", "write", "root", "token-b", exp), 200, "b"},
		// A read signature does not open a write, whoever's it is.
		{"read signature used to write", "POST", signedURL(ps.URL, "/tmp/x", "read", "user", "token-a", exp), 401, ""},
		{"unknown token", "GET", signedURL(ps.URL, "/tmp/x", "read", "user", "token-c", exp), 401, ""},
		{"not /files", "GET", ps.URL + "/health?signature=v1_x", 400, ""},
		{"no signature", "GET", ps.URL + "/files?path=/tmp/x", 400, ""},
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ { // concurrently, as many clients would
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, tt := range tests {
				req, _ := http.NewRequest(tt.method, tt.url, nil)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Errorf("%s: %v", tt.name, err)
					continue
				}
				var got map[string]any
				json.NewDecoder(resp.Body).Decode(&got)
				resp.Body.Close()
				if resp.StatusCode != tt.status {
					t.Errorf("%s: status %d, want %d (%v)", tt.name, resp.StatusCode, tt.status, got)
					continue
				}
				if tt.sandbox != "" && (got["sandbox"] != tt.sandbox || got["method"] != tt.method) {
					t.Errorf("%s: reached %v with %v, want sandbox %s with %s", tt.name, got["sandbox"], got["method"], tt.sandbox, tt.method)
				}
				if tt.status == 401 && got["message"] != "invalid signature" {
					t.Errorf("%s: message %q, want envd's %q", tt.name, got["message"], "invalid signature")
				}
			}
		}()
	}
	wg.Wait()
}
