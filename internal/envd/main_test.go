package envd_test

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/user"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/agentenv/agentenv/client/api/envd/filesystempb/filesystempbconnect"
	"github.com/agentenv/agentenv/client/api/envd/processpb/processpbconnect"
	"github.com/agentenv/agentenv/internal/envd"
)

const testToken = "tok"

// daemon is an envd served in-process, with Connect clients that talk to it
// the way the E2B SDK does (JSON codec, X-Access-Token, Basic auth user).
type daemon struct {
	t    *testing.T
	url  string
	user string // the current user: the default "user" may not exist here
	home string
	proc processpbconnect.ProcessClient
	fs   filesystempbconnect.FilesystemClient
	// startDone receives once per Start request, after its handler returned.
	startDone chan struct{}
}

func startDaemon(t *testing.T, cfg envd.Config) *daemon {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatalf("current user: %v", err)
	}
	d := &daemon{t: t, user: u.Username, home: u.HomeDir, startDone: make(chan struct{}, 16)}
	h := envd.New(cfg).Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		if r.URL.Path == processpbconnect.ProcessStartProcedure {
			select {
			case d.startDone <- struct{}{}:
			default:
			}
		}
	}))
	t.Cleanup(srv.Close)
	d.url = srv.URL
	hc := &http.Client{Transport: headerTransport{base: srv.Client().Transport, set: http.Header{
		"X-Access-Token": {testToken},
		"Authorization":  {basicUser(d.user)},
	}}}
	d.proc = processpbconnect.NewProcessClient(hc, srv.URL, connect.WithProtoJSON())
	d.fs = filesystempbconnect.NewFilesystemClient(hc, srv.URL, connect.WithProtoJSON())
	return d
}

// clients returns Connect clients that send the given headers only.
func (d *daemon) clients(h http.Header) (processpbconnect.ProcessClient, filesystempbconnect.FilesystemClient) {
	hc := &http.Client{Transport: headerTransport{base: http.DefaultTransport, set: h, only: true}}
	return processpbconnect.NewProcessClient(hc, d.url, connect.WithProtoJSON()),
		filesystempbconnect.NewFilesystemClient(hc, d.url, connect.WithProtoJSON())
}

func basicUser(name string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(name+":"))
}

// headerTransport adds headers the request does not set itself (or, with
// only, replaces the auth headers with exactly the given ones).
type headerTransport struct {
	base http.RoundTripper
	set  http.Header
	only bool
}

func (ht headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if ht.only {
		r.Header.Del("X-Access-Token")
		r.Header.Del("Authorization")
	}
	for k, v := range ht.set {
		if r.Header.Get(k) == "" {
			r.Header[k] = v
		}
	}
	return ht.base.RoundTrip(r)
}

// do sends a plain HTTP request to the daemon. hdr may hold
// "X-Access-Token": "" to send no token; otherwise the right one is sent.
func (d *daemon) do(method, path string, body io.Reader, hdr map[string]string) (*http.Response, []byte) {
	d.t.Helper()
	req, err := http.NewRequest(method, d.url+path, body)
	if err != nil {
		d.t.Fatal(err)
	}
	req.Header.Set("X-Access-Token", testToken)
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		d.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp, b
}

// errorBody checks that b is the E2B error body {code, message} for status.
func errorBody(t *testing.T, resp *http.Response, b []byte, status int) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("got status %d (%s), want %d", resp.StatusCode, b, status)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("got Content-Type %q, want application/json", ct)
	}
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("error body %q is not JSON: %v", b, err)
	}
	if e.Code != status || e.Message == "" {
		t.Errorf("got error body %s, want code %d and a message", b, status)
	}
}

// waitFor polls cond until it holds or 30 s pass (a safety net: a loaded
// host can stall for seconds).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
