package envd_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	pb "github.com/agentenv/agentenv/client/api/envd/filesystempb"
	"github.com/agentenv/agentenv/internal/envd"
)

// The E2B SDK unlocks features by envd's version: 0.6.4 is the newest it
// checks for (metadata 0.6.2, includeEntry 0.6.3, allowNetworkMounts 0.6.4).
func TestVersion(t *testing.T) {
	if envd.Version != "0.6.4" {
		t.Errorf("got version %s, want 0.6.4", envd.Version)
	}
}

func needUserXattrs(t *testing.T, dir string) {
	t.Helper()
	p := filepath.Join(dir, ".xattr-probe")
	mustWrite(t, p, "")
	if err := unix.Setxattr(p, "user.probe", []byte("1"), 0); err != nil {
		t.Skipf("the filesystem of %s has no user xattrs: %v", dir, err)
	}
}

type uploaded struct {
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata"`
}

func TestUploadMetadata(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	dir := t.TempDir()
	needUserXattrs(t, dir)
	file := filepath.Join(dir, "f.txt")
	upload := func(hdr map[string]string) (*http.Response, []byte) {
		t.Helper()
		h := map[string]string{"Content-Type": "application/octet-stream"}
		for k, v := range hdr {
			h[k] = v
		}
		return d.do("POST", filesURL(file, d.user), strings.NewReader("data"), h)
	}

	resp, b := upload(map[string]string{"X-Metadata-Owner": "alice", "X-Metadata-step": "3"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upload with metadata: got %d %s", resp.StatusCode, b)
	}
	var got []uploaded
	if err := json.Unmarshal(b, &got); err != nil || len(got) != 1 {
		t.Fatalf("upload answer %s: %v", b, err)
	}
	want := map[string]string{"owner": "alice", "step": "3"}
	if !equalMaps(got[0].Metadata, want) {
		t.Errorf("upload answered metadata %v, want %v (keys lower-cased)", got[0].Metadata, want)
	}
	st, err := d.fs.Stat(context.Background(), connect.NewRequest(statReq(file)))
	if err != nil {
		t.Fatalf("Stat: %v", err)
	}
	if md := st.Msg.GetEntry().GetMetadata(); !equalMaps(md, want) {
		t.Errorf("Stat metadata %v, want %v", md, want)
	}
	if v, err := getXattr(file, "user.e2b.owner"); err != nil || v != "alice" {
		t.Errorf("xattr user.e2b.owner = %q (%v), want alice", v, err)
	}

	// An overwrite replaces the whole set: keys it lacks are gone.
	resp, b = upload(map[string]string{"X-Metadata-Step": "4"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("second upload: got %d %s", resp.StatusCode, b)
	}
	st, _ = d.fs.Stat(context.Background(), connect.NewRequest(statReq(file)))
	if md := st.Msg.GetEntry().GetMetadata(); !equalMaps(md, map[string]string{"step": "4"}) {
		t.Errorf("after overwrite: metadata %v, want only step=4", md)
	}

	// Metadata on a multipart upload too (the SDK's default write).
	ct, body := multipartBody(t, [][2]string{{filepath.Join(dir, "m.txt"), "m"}})
	resp, b = d.do("POST", filesURL("", d.user), strings.NewReader(string(body)), map[string]string{"Content-Type": ct, "X-Metadata-Kind": "multi"})
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"kind":"multi"`) {
		t.Errorf("multipart upload with metadata: got %d %s", resp.StatusCode, b)
	}

	for name, hdr := range map[string]map[string]string{
		"non-ASCII value": {"X-Metadata-K": "caf\xc3\xa9"},
		"too large":       {"X-Metadata-Big": strings.Repeat("x", 5000)},
	} {
		resp, b := upload(hdr)
		errorBody(t, resp, b, http.StatusBadRequest)
		if !strings.Contains(string(b), "invalid metadata") {
			t.Errorf("%s: got %s, want an invalid metadata message", name, b)
		}
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func getXattr(path, name string) (string, error) {
	buf := make([]byte, 256)
	n, err := unix.Getxattr(path, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// watchEvents opens a WatchDir stream and returns a channel of its events.
func watchEvents(t *testing.T, d *daemon, ctx context.Context, req *pb.WatchDirRequest) <-chan *pb.FilesystemEvent {
	t.Helper()
	s, err := d.fs.WatchDir(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatalf("WatchDir: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	if !s.Receive() || s.Msg().GetStart() == nil {
		t.Fatalf("WatchDir: got %v (%v), want the start event", s.Msg(), s.Err())
	}
	ch := make(chan *pb.FilesystemEvent, 100)
	go func() {
		defer close(ch)
		for s.Receive() {
			if ev := s.Msg().GetFilesystem(); ev != nil {
				ch <- ev
			}
		}
	}()
	return ch
}

// An upload shows watchers what E2B's envd shows: written in place (no
// temporary file, no rename), a new file's CREATE, CHMOD (its chown to the
// user), WRITE; an existing file's CHMOD, then WRITE (the truncate and the
// data, one event when inotify merges them).
func TestUploadWatchEvents(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	events := watchEvents(t, d, ctx, &pb.WatchDirRequest{Path: dir, IncludeEntry: true})
	upload := func(content string) []*pb.FilesystemEvent {
		t.Helper()
		resp, b := d.do("POST", filesURL(filepath.Join(dir, "up.txt"), d.user), strings.NewReader(content), map[string]string{"Content-Type": "application/octet-stream"})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("upload: got %d %s", resp.StatusCode, b)
		}
		return quietEvents(t, ctx, events)
	}
	types := func(evs []*pb.FilesystemEvent) string {
		var ts []string
		for _, ev := range evs {
			ts = append(ts, ev.GetName()+":"+strings.TrimPrefix(ev.GetType().String(), "EVENT_TYPE_"))
		}
		return strings.Join(ts, " ")
	}

	evs := upload("hello")
	if got, want := types(evs), "up.txt:CREATE up.txt:CHMOD up.txt:WRITE"; got != want {
		t.Errorf("new file: got events %q, want %q (E2B's)", got, want)
	}
	for _, ev := range evs {
		if e := ev.GetEntry(); e.GetType() != pb.FileType_FILE_TYPE_FILE || e.GetPath() != filepath.Join(dir, "up.txt") {
			t.Errorf("%v event entry %v, want the file's entry (includeEntry)", ev.GetType(), e)
		}
	}
	got := types(upload("hello again"))
	if rest, ok := strings.CutPrefix(got, "up.txt:CHMOD up.txt:WRITE"); !ok || strings.Trim(strings.ReplaceAll(rest, " up.txt:WRITE", ""), " ") != "" {
		t.Errorf("existing file: got events %q, want CHMOD then WRITE (E2B's)", got)
	}
}

// quietEvents collects the events that arrive until none has for 300 ms.
func quietEvents(t *testing.T, ctx context.Context, events <-chan *pb.FilesystemEvent) []*pb.FilesystemEvent {
	t.Helper()
	var out []*pb.FilesystemEvent
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("watch ended early")
			}
			out = append(out, ev)
		case <-time.After(300 * time.Millisecond):
			return out
		case <-ctx.Done():
			t.Fatal("watch: context ended")
		}
	}
}

// Remove and rename events carry no entry: their path may already name
// another file (E2B's rule).
func TestWatchEntryOnlyForLiveEvents(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	events := watchEvents(t, d, ctx, &pb.WatchDirRequest{Path: dir, IncludeEntry: true, AllowNetworkMounts: false})
	mustWrite(t, filepath.Join(dir, "a"), "x")
	if _, err := d.fs.Move(ctx, connect.NewRequest(&pb.MoveRequest{Source: filepath.Join(dir, "a"), Destination: filepath.Join(dir, "b")})); err != nil {
		t.Fatal(err)
	}
	if _, err := d.fs.Remove(ctx, connect.NewRequest(&pb.RemoveRequest{Path: filepath.Join(dir, "b")})); err != nil {
		t.Fatal(err)
	}
	seen := map[pb.EventType]bool{}
	for !seen[pb.EventType_EVENT_TYPE_REMOVE] {
		select {
		case ev := <-events:
			seen[ev.GetType()] = true
			switch ev.GetType() {
			case pb.EventType_EVENT_TYPE_REMOVE, pb.EventType_EVENT_TYPE_RENAME:
				if ev.Entry != nil {
					t.Errorf("%v event of %s carries an entry", ev.GetType(), ev.GetName())
				}
			}
		case <-ctx.Done():
			t.Fatalf("no remove event; saw %v", seen)
		}
	}
	if !seen[pb.EventType_EVENT_TYPE_RENAME] || !seen[pb.EventType_EVENT_TYPE_CREATE] {
		t.Errorf("saw %v, want create (new file and moved-in b), rename (a) and remove", seen)
	}
}

// Signed /files URLs are refused with E2B envd's texts.
func TestSignatureErrors(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	file := filepath.Join(t.TempDir(), "f")
	mustWrite(t, file, "x")
	sign := func(exp string) string {
		msg := file + ":read:" + d.user + ":" + testToken
		if exp != "" {
			msg += ":" + exp
		}
		sum := sha256.Sum256([]byte(msg))
		return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
	}
	past := strconv.FormatInt(time.Now().Add(-time.Minute).Unix(), 10)
	future := strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)
	tests := []struct {
		name, sig, exp, token string
		status                int
		msg                   string
	}{
		{"valid", sign(""), "", "", http.StatusOK, ""},
		{"valid until later", sign(future), future, "", http.StatusOK, ""},
		{"expired", sign(past), past, "", http.StatusUnauthorized, "signature is already expired"},
		{"wrong", "v1_nope", "", "", http.StatusUnauthorized, "invalid signature"},
		{"missing", "", "", "", http.StatusUnauthorized, "missing signature query parameter"},
		{"wrong header token", sign(""), "", "nope", http.StatusUnauthorized, "access token present in header but does not match"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := url.Values{"path": {file}, "username": {d.user}}
			if tt.sig != "" {
				q.Set("signature", tt.sig)
			}
			if tt.exp != "" {
				q.Set("signature_expiration", tt.exp)
			}
			resp, b := d.do("GET", "/files?"+q.Encode(), nil, map[string]string{"X-Access-Token": tt.token})
			if tt.status == http.StatusOK {
				if resp.StatusCode != http.StatusOK || string(b) != "x" {
					t.Errorf("got %d %q, want 200 with the file", resp.StatusCode, b)
				}
				return
			}
			errorBody(t, resp, b, tt.status)
			var e struct{ Message string }
			json.Unmarshal(b, &e)
			if e.Message != tt.msg {
				t.Errorf("got message %q, want %q (E2B's text)", e.Message, tt.msg)
			}
		})
	}
}
