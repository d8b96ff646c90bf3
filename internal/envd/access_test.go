package envd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"agentenv/internal/envd"
	fspb "agentenv/internal/envd/gen/filesystempb"
	"agentenv/internal/envd/gen/filesystempb/filesystempbconnect"
	procpb "agentenv/internal/envd/gen/processpb"
	"agentenv/internal/testenv"
)

// unprivileged is the user the access tests act as: it exists on every
// Debian-like host, as "user" exists in every sandbox.
const unprivileged = "nobody"

// fixture is a tree owned by root, with a home directory of the
// unprivileged user in it:
//
//	base/          root 0755
//	  etc/passwd   root 0644 "original"
//	  secret/      root 0700
//	    file       root 0644 "secret"
//	  home/        unprivileged 0755
type fixture struct {
	base, etc, passwd, secret, secretFile, home string
	uid, gid                                    int
}

func needUnprivileged(t *testing.T) *user.User {
	t.Helper()
	testenv.NeedRoot(t)
	u, err := user.Lookup(unprivileged)
	if err != nil {
		t.Skipf("skipping: no user %q on this host to act as", unprivileged)
	}
	return u
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	u := needUnprivileged(t)
	base := t.TempDir()
	fx := fixture{base: base, etc: filepath.Join(base, "etc"), secret: filepath.Join(base, "secret"), home: filepath.Join(base, "home")}
	fx.passwd = filepath.Join(fx.etc, "passwd")
	fx.secretFile = filepath.Join(fx.secret, "file")
	fx.uid, _ = strconv.Atoi(u.Uid)
	fx.gid, _ = strconv.Atoi(u.Gid)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// t.TempDir makes a 0700 directory per test with one per call in it.
	must(os.Chmod(filepath.Dir(base), 0o755))
	must(os.Chmod(base, 0o755))
	must(os.Mkdir(fx.etc, 0o755))
	must(os.WriteFile(fx.passwd, []byte("original"), 0o644))
	must(os.Mkdir(fx.secret, 0o700))
	must(os.WriteFile(fx.secretFile, []byte("secret"), 0o644))
	must(os.Mkdir(fx.home, 0o755))
	must(os.Chown(fx.home, fx.uid, fx.gid))
	return fx
}

// snapshot describes everything under base outside home: names, modes,
// owners and contents.
func (fx fixture) snapshot(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(fx.base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == fx.home {
			return filepath.SkipDir
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		fmt.Fprintf(&b, "%s %v %d:%d", p, info.Mode(), st.Uid, st.Gid)
		if info.Mode().IsRegular() {
			c, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " %q", c)
		}
		b.WriteByte('\n')
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	return b.String()
}

// as returns a filesystem client that sends name as the request's user.
func (d *daemon) as(name string) filesystempbconnect.FilesystemClient {
	_, fsc := d.clients(http.Header{"X-Access-Token": {testToken}, "Authorization": {basicUser(name)}})
	return fsc
}

// restOutcome is how a request ended: "" if allowed, "denied" if refused
// for permission with a message naming the user and the path; anything else
// is reported as is.
func restOutcome(resp *http.Response, body []byte, user, path string) string {
	switch resp.StatusCode {
	case http.StatusOK:
		return ""
	case http.StatusForbidden:
		var e struct{ Message string }
		json.Unmarshal(body, &e)
		if !strings.Contains(e.Message, strconv.Quote(user)) || !strings.Contains(e.Message, strconv.Quote(path)) {
			return fmt.Sprintf("403 without user %q and path %q in the message: %s", user, path, body)
		}
		return "denied"
	}
	return fmt.Sprintf("status %d: %s", resp.StatusCode, body)
}

func connectOutcome(err error, user, path string) string {
	switch {
	case err == nil:
		return ""
	case connect.CodeOf(err) == connect.CodePermissionDenied:
		if msg := err.Error(); !strings.Contains(msg, strconv.Quote(user)) || !strings.Contains(msg, strconv.Quote(path)) {
			return fmt.Sprintf("permission_denied without user %q and path %q in the message: %v", user, path, err)
		}
		return "denied"
	}
	return err.Error()
}

// accessOp is one file operation against the fixture's root-owned files.
type accessOp struct {
	name string
	// do runs the operation as user and returns its outcome (see restOutcome).
	do func(t *testing.T, d *daemon, fx fixture, user string) string
	// changes says the operation, where allowed, changes the root-owned tree.
	changes bool
}

var accessOps = []accessOp{
	{"upload over a root file", func(t *testing.T, d *daemon, fx fixture, u string) string {
		resp, b := d.do("POST", filesURL(fx.passwd, u), strings.NewReader("owned"), map[string]string{"Content-Type": "application/octet-stream"})
		return restOutcome(resp, b, u, fx.passwd)
	}, true},
	{"upload over a root file, user from basic auth", func(t *testing.T, d *daemon, fx fixture, u string) string {
		resp, b := d.do("POST", filesURL(fx.passwd, ""), strings.NewReader("owned"), map[string]string{"Content-Type": "application/octet-stream", "Authorization": basicUser(u)})
		return restOutcome(resp, b, u, fx.passwd)
	}, true},
	{"multipart upload of a new file in a root directory", func(t *testing.T, d *daemon, fx fixture, u string) string {
		p := filepath.Join(fx.etc, "new")
		ct, body := multipartBody(t, [][2]string{{p, "new"}})
		resp, b := d.do("POST", filesURL("", u), bytes.NewReader(body), map[string]string{"Content-Type": ct})
		return restOutcome(resp, b, u, p)
	}, true},
	{"upload creating a directory in a root directory", func(t *testing.T, d *daemon, fx fixture, u string) string {
		p := filepath.Join(fx.etc, "sub", "file")
		resp, b := d.do("POST", filesURL(p, u), strings.NewReader("new"), map[string]string{"Content-Type": "application/octet-stream"})
		return restOutcome(resp, b, u, p)
	}, true},
	{"download from a 0700 root directory", func(t *testing.T, d *daemon, fx fixture, u string) string {
		resp, b := d.do("GET", filesURL(fx.secretFile, u), nil, nil)
		if resp.StatusCode == http.StatusOK && string(b) != "secret" {
			return fmt.Sprintf("downloaded %q, want %q", b, "secret")
		}
		return restOutcome(resp, b, u, fx.secretFile)
	}, false},
	{"Move a root file", func(t *testing.T, d *daemon, fx fixture, u string) string {
		_, err := d.as(u).Move(t.Context(), connect.NewRequest(&fspb.MoveRequest{Source: fx.passwd, Destination: filepath.Join(fx.home, "passwd")}))
		return connectOutcome(err, u, filepath.Join(fx.home, "passwd"))
	}, true},
	{"Move into a root directory", func(t *testing.T, d *daemon, fx fixture, u string) string {
		src := filepath.Join(fx.home, "mine")
		if err := os.WriteFile(src, []byte("mine"), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := d.as(u).Move(t.Context(), connect.NewRequest(&fspb.MoveRequest{Source: src, Destination: fx.passwd}))
		return connectOutcome(err, u, fx.passwd)
	}, true},
	{"Remove a root file", func(t *testing.T, d *daemon, fx fixture, u string) string {
		_, err := d.as(u).Remove(t.Context(), connect.NewRequest(&fspb.RemoveRequest{Path: fx.passwd}))
		return connectOutcome(err, u, fx.passwd)
	}, true},
	{"MakeDir in a root directory", func(t *testing.T, d *daemon, fx fixture, u string) string {
		p := filepath.Join(fx.etc, "a", "b")
		_, err := d.as(u).MakeDir(t.Context(), connect.NewRequest(&fspb.MakeDirRequest{Path: p}))
		return connectOutcome(err, u, p)
	}, true},
	{"ListDir of a 0700 root directory", func(t *testing.T, d *daemon, fx fixture, u string) string {
		resp, err := d.as(u).ListDir(t.Context(), connect.NewRequest(&fspb.ListDirRequest{Path: fx.secret, Depth: 1}))
		if err == nil && len(resp.Msg.GetEntries()) != 1 {
			return fmt.Sprintf("listed %v, want the one file", resp.Msg.GetEntries())
		}
		return connectOutcome(err, u, fx.secret)
	}, false},
	{"Stat in a 0700 root directory", func(t *testing.T, d *daemon, fx fixture, u string) string {
		_, err := d.as(u).Stat(t.Context(), connect.NewRequest(statReq(fx.secretFile)))
		return connectOutcome(err, u, fx.secretFile)
	}, false},
	{"WatchDir of a 0700 root directory", func(t *testing.T, d *daemon, fx fixture, u string) string {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		s, err := d.as(u).WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: fx.secret}))
		if err == nil {
			defer s.Close()
			if !s.Receive() {
				err = s.Err()
			}
		}
		return connectOutcome(err, u, fx.secret)
	}, false},
	{"CreateWatcher of a 0700 root directory", func(t *testing.T, d *daemon, fx fixture, u string) string {
		resp, err := d.as(u).CreateWatcher(t.Context(), connect.NewRequest(&fspb.CreateWatcherRequest{Path: fx.secret}))
		if err == nil {
			d.as(u).RemoveWatcher(t.Context(), connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: resp.Msg.GetWatcherId()}))
		}
		return connectOutcome(err, u, fx.secret)
	}, false},
	{"Start in a 0700 root directory", func(t *testing.T, d *daemon, fx fixture, u string) string {
		proc, _ := d.clients(http.Header{"X-Access-Token": {testToken}, "Authorization": {basicUser(u)}})
		s, err := proc.Start(t.Context(), connect.NewRequest(&procpb.StartRequest{
			Process: &procpb.ProcessConfig{Cmd: "/bin/true", Cwd: proto.String(fx.secret)}}))
		if err == nil {
			for s.Receive() {
			}
			err = s.Err()
			s.Close()
		}
		return connectOutcome(err, u, fx.secret)
	}, false},
}

// Every file operation runs with the requested user's credentials: the
// unprivileged user is refused what root owns, root is not.
func TestFileAccessIsTheUsers(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	for _, op := range accessOps {
		t.Run(op.name, func(t *testing.T) {
			fx := newFixture(t)
			before := fx.snapshot(t)
			if got := op.do(t, d, fx, unprivileged); got != "denied" {
				t.Errorf("as %s: got %q, want denied", unprivileged, got)
			}
			if after := fx.snapshot(t); after != before {
				t.Errorf("as %s: the root-owned tree changed:\n%s\nwant unchanged:\n%s", unprivileged, after, before)
			}
			if got := op.do(t, d, fx, "root"); got != "" {
				t.Errorf("as root: got %q, want allowed", got)
			}
			if changed := fx.snapshot(t) != before; changed != op.changes {
				t.Errorf("as root: got tree changed %v, want %v", changed, op.changes)
			}
		})
	}
}

// A symlink the user plants in their own directory leads file operations
// only where the user could go: here not to root's etc/passwd.
func TestSymlinkedParentIsFollowedAsTheUser(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	fx := newFixture(t)
	link := filepath.Join(fx.home, "link")
	proc, _ := d.clients(http.Header{"X-Access-Token": {testToken}, "Authorization": {basicUser(unprivileged)}})
	s, err := proc.Start(t.Context(), connect.NewRequest(&procpb.StartRequest{Process: &procpb.ProcessConfig{
		Cmd: "/bin/ln", Args: []string{"-s", fx.etc, link}, Cwd: proto.String(fx.home)}}))
	if err != nil {
		t.Fatalf("Start ln -s as %s: %v", unprivileged, err)
	}
	for s.Receive() {
	}
	s.Close()
	if st, err := os.Lstat(link); err != nil || st.Sys().(*syscall.Stat_t).Uid != uint32(fx.uid) {
		t.Fatalf("the user's symlink %s is missing or not theirs: %v", link, err)
	}
	before := fx.snapshot(t)
	via := filepath.Join(link, "passwd")
	tests := []struct {
		name string
		do   func() string
	}{
		{"upload", func() string {
			resp, b := d.do("POST", filesURL(via, unprivileged), strings.NewReader("owned"), map[string]string{"Content-Type": "application/octet-stream"})
			return restOutcome(resp, b, unprivileged, via)
		}},
		{"multipart upload", func() string {
			ct, body := multipartBody(t, [][2]string{{via, "owned"}})
			resp, b := d.do("POST", filesURL("", unprivileged), bytes.NewReader(body), map[string]string{"Content-Type": ct})
			return restOutcome(resp, b, unprivileged, via)
		}},
		{"upload into a new directory", func() string {
			p := filepath.Join(link, "sub", "x")
			resp, b := d.do("POST", filesURL(p, unprivileged), strings.NewReader("owned"), map[string]string{"Content-Type": "application/octet-stream"})
			return restOutcome(resp, b, unprivileged, p)
		}},
		{"Remove", func() string {
			_, err := d.as(unprivileged).Remove(t.Context(), connect.NewRequest(&fspb.RemoveRequest{Path: via}))
			return connectOutcome(err, unprivileged, via)
		}},
		{"MakeDir", func() string {
			p := filepath.Join(link, "dir")
			_, err := d.as(unprivileged).MakeDir(t.Context(), connect.NewRequest(&fspb.MakeDirRequest{Path: p}))
			return connectOutcome(err, unprivileged, p)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.do(); got != "denied" {
				t.Errorf("got %q, want denied", got)
			}
			if after := fx.snapshot(t); after != before {
				t.Errorf("the root-owned tree changed:\n%s\nwant unchanged:\n%s", after, before)
			}
		})
	}
}

// What the user may do works, and what it creates is theirs: the file and
// every parent directory made for it.
func TestUploadInHomeIsOwnedByTheUser(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	fx := newFixture(t)
	p := filepath.Join(fx.home, "a", "b", "file")
	resp, b := d.do("POST", filesURL(p, unprivileged), strings.NewReader("mine"), map[string]string{"Content-Type": "application/octet-stream"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upload as %s into its home: got status %d (%s), want 200", unprivileged, resp.StatusCode, b)
	}
	moved := filepath.Join(fx.home, "c", "moved")
	if _, err := d.as(unprivileged).Move(t.Context(), connect.NewRequest(&fspb.MoveRequest{Source: p, Destination: moved})); err != nil {
		t.Fatalf("Move as %s inside its home: %v", unprivileged, err)
	}
	dir := filepath.Join(fx.home, "d", "e")
	if _, err := d.as(unprivileged).MakeDir(t.Context(), connect.NewRequest(&fspb.MakeDirRequest{Path: dir})); err != nil {
		t.Fatalf("MakeDir as %s inside its home: %v", unprivileged, err)
	}
	for _, p := range []string{filepath.Join(fx.home, "a"), filepath.Join(fx.home, "a", "b"), filepath.Join(fx.home, "c"), moved, filepath.Join(fx.home, "d"), dir} {
		st, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		sys := st.Sys().(*syscall.Stat_t)
		if int(sys.Uid) != fx.uid || int(sys.Gid) != fx.gid {
			t.Errorf("%s: got owner %d:%d, want %d:%d", p, sys.Uid, sys.Gid, fx.uid, fx.gid)
		}
	}
	if got := readFile(t, moved); got != "mine" {
		t.Errorf("got %q, want mine", got)
	}
}

// Credentials switch per OS thread: under load, requests of root and of the
// unprivileged user interleave without one ever getting the other's rights.
func TestConcurrentUsersKeepTheirOwnRights(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	fx := newFixture(t)
	const workers, rounds = 16, 20
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []string
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				u, want := "root", ""
				if (w+r)%2 == 1 {
					u, want = unprivileged, "denied"
				}
				p := filepath.Join(fx.etc, fmt.Sprintf("f-%d-%d", w, r))
				var got string
				if r%3 == 0 {
					_, err := d.as(u).MakeDir(context.Background(), connect.NewRequest(&fspb.MakeDirRequest{Path: p}))
					got = connectOutcome(err, u, p)
				} else {
					req, _ := http.NewRequest("POST", d.url+filesURL(p, u), strings.NewReader(u))
					req.Header.Set("X-Access-Token", testToken)
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						got = err.Error()
					} else {
						var b bytes.Buffer
						b.ReadFrom(resp.Body)
						resp.Body.Close()
						got = restOutcome(resp, b.Bytes(), u, p)
					}
				}
				if got != want {
					mu.Lock()
					errs = append(errs, fmt.Sprintf("%s as %s: got %q, want %q", p, u, got, want))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	for _, e := range errs {
		t.Error(e)
	}
	entries, err := os.ReadDir(fx.etc)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if n := 1 + workers*rounds/2; len(got) != n || !slices.Contains(got, "passwd") {
		t.Errorf("got %d entries in etc, want %d (passwd and root's): %q", len(got), n, got)
	}
}
