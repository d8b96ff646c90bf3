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

	"github.com/agentenv/agentenv/internal/envdapi/envdauth"
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
	q.Set("signature", envdauth.FileSignature(path, op, user, token, e))
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

// TestNoWakeWithoutToken: traffic to envd of a paused sandbox that
// resumes on traffic wakes it only when it carries envd's access token or
// a valid signature; anything else gets envd's 401 and the sandbox stays
// paused (a keyless caller could otherwise keep anyone's sandbox awake).
func TestNoWakeWithoutToken(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(echoHandler))
	defer be.Close()
	const token = "envd-token-0123"
	now := time.Now().Unix()
	for _, tc := range []struct {
		name string
		req  func(base string) *http.Request
		want int
	}{
		{"no token", func(base string) *http.Request {
			r, _ := http.NewRequest("GET", base+"/health", nil)
			return r
		}, http.StatusUnauthorized},
		{"wrong token", func(base string) *http.Request {
			r, _ := http.NewRequest("POST", base+"/process.Process/List", nil)
			r.Header.Set("X-Access-Token", "not-"+token)
			return r
		}, http.StatusUnauthorized},
		{"the traffic token only", func(base string) *http.Request {
			r, _ := http.NewRequest("GET", base+"/health", nil)
			r.Header.Set(proxy.TrafficTokenHeader, "traffic-0123")
			return r
		}, http.StatusUnauthorized},
		{"expired signature", func(base string) *http.Request {
			r, _ := http.NewRequest("GET", signedURL(base, "/tmp/x", "read", "user", token, now-60), nil)
			return r
		}, http.StatusUnauthorized},
		{"signature for another operation", func(base string) *http.Request {
			r, _ := http.NewRequest("POST", signedURL(base, "/tmp/x", "read", "user", token, now+60), nil)
			return r
		}, http.StatusUnauthorized},
		{"its token", func(base string) *http.Request {
			r, _ := http.NewRequest("GET", base+"/health", nil)
			r.Header.Set("X-Access-Token", token)
			return r
		}, http.StatusOK},
		{"a valid signature", func(base string) *http.Request {
			r, _ := http.NewRequest("GET", signedURL(base, "/tmp/x", "read", "user", token, now+60), nil)
			return r
		}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &tokenResolver{
				fakeResolver: fakeResolver{boxes: map[string]fakeBox{
					"sleepy": {addr: be.Listener.Addr().String(), gone: make(chan struct{}), token: "traffic-0123", asleep: true, envdToken: token},
				}},
				tokens: map[string]string{"sleepy": token},
			}
			ps := httptest.NewServer(proxy.New(r, slog.New(slog.NewTextHandler(io.Discard, nil))))
			defer ps.Close()
			for _, how := range []string{"host", "headers"} {
				req := tc.req(ps.URL)
				if how == "host" {
					req.Host = "49983-sleepy.example.com"
				} else {
					req.Header.Set("E2b-Sandbox-Id", "sleepy")
					req.Header.Set("E2b-Sandbox-Port", "49983")
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != tc.want {
					t.Errorf("by %s: got HTTP %d, want %d", how, resp.StatusCode, tc.want)
				}
				woke := r.woken.Load() > 0
				if woke != (tc.want == http.StatusOK) {
					t.Errorf("by %s: sandbox resumed %v, want %v", how, woke, tc.want == http.StatusOK)
				}
				if tc.want == http.StatusOK {
					break // awake now: the second way proves nothing more
				}
			}
		})
	}
}
