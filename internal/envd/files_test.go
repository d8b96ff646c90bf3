package envd_test

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/json"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/envd"
)

type fileEntry struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

func filesURL(path, user string) string {
	q := url.Values{}
	if path != "" {
		q.Set("path", path)
	}
	if user != "" {
		q.Set("username", user)
	}
	return "/files?" + q.Encode()
}

func gzipped(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// multipartBody builds the SDK's multi-file write: one part per file, each
// named "file" with the whole destination path as its filename.
func multipartBody(t *testing.T, files [][2]string) (string, []byte) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, f := range files {
		w, err := mw.CreateFormFile("file", f[0])
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(f[1]))
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return mw.FormDataContentType(), buf.Bytes()
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return string(b)
}

func TestPostFilesMultipart(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	dir := t.TempDir()
	rel, err := filepath.Rel(d.home, filepath.Join(dir, "sub", "b.txt"))
	if err != nil {
		t.Fatal(err)
	}
	ct, body := multipartBody(t, [][2]string{
		{filepath.Join(dir, "a.txt"), "alpha"},
		{rel, "beta"}, // relative: taken from the user's home
	})
	resp, b := d.do("POST", filesURL("", d.user), bytes.NewReader(body), map[string]string{"Content-Type": ct})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("got status %d (%s), want 200", resp.StatusCode, b)
	}
	var got []fileEntry
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("response %q: %v", b, err)
	}
	want := []fileEntry{
		{Name: "a.txt", Type: "file", Path: filepath.Join(dir, "a.txt")},
		{Name: "b.txt", Type: "file", Path: filepath.Join(dir, "sub", "b.txt")},
	}
	if len(got) != len(want) {
		t.Fatalf("got entries %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if got := readFile(t, filepath.Join(dir, "a.txt")); got != "alpha" {
		t.Errorf("got a.txt %q, want alpha", got)
	}
	if got := readFile(t, filepath.Join(dir, "sub", "b.txt")); got != "beta" {
		t.Errorf("got sub/b.txt %q, want beta", got)
	}

	// The single-file form: ?path= wins over the part's file name.
	ct, body = multipartBody(t, [][2]string{{"ignored-name", "gamma"}})
	target := filepath.Join(dir, "c.txt")
	resp, b = d.do("POST", filesURL(target, d.user), bytes.NewReader(body), map[string]string{"Content-Type": ct})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("single multipart: got status %d (%s), want 200", resp.StatusCode, b)
	}
	if got := readFile(t, target); got != "gamma" {
		t.Errorf("got c.txt %q, want gamma", got)
	}
}

func TestPostFilesOctetStream(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	dir := t.TempDir()
	data := []byte(strings.Repeat("octet-stream data\n", 1000))
	tests := []struct {
		name string
		body []byte
		hdr  map[string]string
	}{
		{"plain", data, nil},
		{"gzip", gzipped(t, data), map[string]string{"Content-Encoding": "gzip"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target := filepath.Join(dir, tt.name, "out.txt")
			hdr := map[string]string{"Content-Type": "application/octet-stream"}
			for k, v := range tt.hdr {
				hdr[k] = v
			}
			resp, b := d.do("POST", filesURL(target, d.user), bytes.NewReader(tt.body), hdr)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("got status %d (%s), want 200", resp.StatusCode, b)
			}
			var got []fileEntry
			if err := json.Unmarshal(b, &got); err != nil || len(got) != 1 || got[0].Path != target {
				t.Errorf("got response %s, want one entry for %s", b, target)
			}
			if got := readFile(t, target); got != string(data) {
				t.Errorf("got %d bytes written, want the %d bytes sent", len(got), len(data))
			}
		})
	}
}

func TestGetFileRoundTrip(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	data := make([]byte, 5<<20)
	rand.Read(data)
	target := filepath.Join(t.TempDir(), "blob.bin")
	resp, b := d.do("POST", filesURL(target, d.user), bytes.NewReader(data), map[string]string{"Content-Type": "application/octet-stream"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upload: got status %d (%s), want 200", resp.StatusCode, b)
	}
	resp, b = d.do("GET", filesURL(target, d.user), nil, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("download: got status %d (%s), want 200", resp.StatusCode, b)
	}
	if !bytes.Equal(b, data) {
		t.Errorf("got %d bytes back, want the identical %d bytes", len(b), len(data))
	}
	if got, want := resp.Header.Get("Content-Length"), strconv.Itoa(len(data)); got != want {
		t.Errorf("got Content-Length %q, want %q", got, want)
	}
}

// Files that report size 0 but have content (/proc, /sys) are read, not
// answered empty.
func TestGetProcFile(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	resp, b := d.do("GET", filesURL("/proc/self/status", d.user), nil, nil)
	if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte("Name:")) {
		t.Fatalf("GET /proc/self/status: got %d %q, want 200 with the process's status", resp.StatusCode, b)
	}
}

func TestGetFileErrors(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	dir := t.TempDir()
	tests := []struct {
		name   string
		path   string
		user   string
		status int
	}{
		{"missing file", filepath.Join(dir, "missing"), d.user, http.StatusNotFound},
		{"directory", dir, d.user, http.StatusBadRequest},
		{"unknown user", filepath.Join(dir, "x"), "agentenv-no-such-user", http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := d.do("GET", filesURL(tt.path, tt.user), nil, nil)
			errorBody(t, resp, b, tt.status)
		})
	}
}

func TestPostFilesTooLarge(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken, MaxUpload: 1024})
	dir := t.TempDir()
	big := bytes.Repeat([]byte("x"), 8<<10)
	ct, mp := multipartBody(t, [][2]string{{filepath.Join(dir, "multi.bin"), string(big)}})
	tests := []struct {
		name, target, ct string
		body             []byte
	}{
		{"octet-stream", filepath.Join(dir, "octet.bin"), "application/octet-stream", big},
		{"multipart", "", ct, mp},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := d.do("POST", filesURL(tt.target, d.user), bytes.NewReader(tt.body), map[string]string{"Content-Type": tt.ct})
			errorBody(t, resp, b, http.StatusRequestEntityTooLarge)
		})
	}
	// A refused upload leaves neither the file nor a temporary file.
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("refused upload left %s behind", e.Name())
	}
}

func TestFilesAuth(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	target := filepath.Join(t.TempDir(), "f")
	tests := []struct {
		name, method string
		token        string
	}{
		{"GET no token", "GET", ""},
		{"GET wrong token", "GET", "nope"},
		{"POST no token", "POST", ""},
		{"POST wrong token", "POST", "nope"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := d.do(tt.method, filesURL(target, d.user), strings.NewReader("data"),
				map[string]string{"X-Access-Token": tt.token, "Content-Type": "application/octet-stream"})
			errorBody(t, resp, b, http.StatusUnauthorized)
		})
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Errorf("an unauthenticated POST wrote %s (stat: %v)", target, err)
	}
	resp, b := d.do("GET", "/health", nil, map[string]string{"X-Access-Token": ""})
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("/health without a token: got status %d (%s), want 204", resp.StatusCode, b)
	}
}

// The control plane pushes the sandbox's envVars (and may rotate the
// token) through POST /init; every later command sees the variables.
func TestInit(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken, Envs: map[string]string{"KEEP": "1"}})
	resp, b := d.do("POST", "/init", strings.NewReader(`{"envVars":{"FROM_INIT":"yes"}}`), map[string]string{"X-Access-Token": ""})
	errorBody(t, resp, b, http.StatusUnauthorized)

	resp, b = d.do("POST", "/init", strings.NewReader(`{"envVars":{"FROM_INIT":"yes"}}`), map[string]string{"Content-Type": "application/json"})
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST /init: got status %d (%s), want 204", resp.StatusCode, b)
	}
	resp, b = d.do("GET", "/envs", nil, nil)
	var envs map[string]string
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &envs) != nil || envs["FROM_INIT"] != "yes" || envs["KEEP"] != "1" {
		t.Errorf("GET /envs: got %d %s, want FROM_INIT=yes and KEEP=1", resp.StatusCode, b)
	}
	r, err := d.run(t.Context(), sh(`echo "$FROM_INIT $KEEP"`))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if r.stdout != "yes 1\n" {
		t.Errorf("got stdout %q, want %q", r.stdout, "yes 1\n")
	}

	resp, b = d.do("POST", "/init", strings.NewReader(`{"accessToken":"rotated"}`), nil)
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST /init with a new token: got status %d (%s), want 204", resp.StatusCode, b)
	}
	resp, b = d.do("GET", "/envs", nil, nil)
	errorBody(t, resp, b, http.StatusUnauthorized)
	resp, b = d.do("GET", "/envs", nil, map[string]string{"X-Access-Token": "rotated"})
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /envs with the rotated token: got %d (%s), want 200", resp.StatusCode, b)
	}
}
