package envd_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	fspb "github.com/agentenv/agentenv/client/api/envd/filesystempb"
	"github.com/agentenv/agentenv/client/api/envd/filesystempb/filesystempbconnect"
	procpb "github.com/agentenv/agentenv/client/api/envd/processpb"
	"github.com/agentenv/agentenv/internal/envd"
	"github.com/agentenv/agentenv/internal/testenv"
)

// unprivileged is the user the ownership tests act as: it exists on every
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

// owner returns "uid:gid" of path (not following a final symlink).
func owner(t *testing.T, path string) string {
	t.Helper()
	st, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	return fmt.Sprintf("%d:%d", sys.Uid, sys.Gid)
}

// as returns a filesystem client that sends name as the request's user.
func (d *daemon) as(name string) filesystempbconnect.FilesystemClient {
	_, fsc := d.clients(http.Header{"X-Access-Token": {testToken}, "Authorization": {basicUser(name)}})
	return fsc
}

// File operations act as root for whatever user the request names, as E2B's
// envd does (the user inside a sandbox is not a boundary): the unprivileged
// user reads, lists, watches, writes, moves and removes what root owns.
// What is created for it is its own: new directories, new files, and a file
// it overwrites; existing directories and a moved entry keep their owner.
func TestFileOpsActAsRootForTheUser(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	u := unprivileged
	octet := map[string]string{"Content-Type": "application/octet-stream"}
	ctx := t.Context()

	t.Run("read, list, stat and watch root's 0700 directory", func(t *testing.T) {
		fx := newFixture(t)
		if resp, b := d.do("GET", filesURL(fx.secretFile, u), nil, nil); resp.StatusCode != http.StatusOK || string(b) != "secret" {
			t.Errorf("download: got %d %q, want 200 %q", resp.StatusCode, b, "secret")
		}
		if resp, err := d.as(u).ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: fx.secret, Depth: 1})); err != nil || len(resp.Msg.GetEntries()) != 1 {
			t.Errorf("ListDir: got %v (%v), want the one file", resp, err)
		}
		if _, err := d.as(u).Stat(ctx, connect.NewRequest(statReq(fx.secretFile))); err != nil {
			t.Errorf("Stat: %v", err)
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		s, err := d.as(u).WatchDir(wctx, connect.NewRequest(&fspb.WatchDirRequest{Path: fx.secret}))
		if err != nil || !s.Receive() || s.Msg().GetStart() == nil {
			t.Errorf("WatchDir: %v", err)
		}
		if s != nil {
			s.Close()
		}
	})

	t.Run("upload over a root file", func(t *testing.T) {
		fx := newFixture(t)
		if resp, b := d.do("POST", filesURL(fx.passwd, u), strings.NewReader("owned"), octet); resp.StatusCode != http.StatusOK {
			t.Fatalf("got %d %s, want 200", resp.StatusCode, b)
		}
		if got := readFile(t, fx.passwd); got != "owned" {
			t.Errorf("got %q, want owned", got)
		}
		if got, want := owner(t, fx.passwd), fmt.Sprintf("%d:%d", fx.uid, fx.gid); got != want {
			t.Errorf("overwritten file: got owner %s, want the user's %s (as E2B)", got, want)
		}
		if got := owner(t, fx.etc); got != "0:0" {
			t.Errorf("existing parent: got owner %s, want 0:0 kept", got)
		}
	})

	t.Run("upload under new directories, user from basic auth", func(t *testing.T) {
		fx := newFixture(t)
		p := filepath.Join(fx.etc, "a", "b", "file")
		resp, b := d.do("POST", filesURL(p, ""), strings.NewReader("new"), map[string]string{"Content-Type": "application/octet-stream", "Authorization": basicUser(u)})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("got %d %s, want 200", resp.StatusCode, b)
		}
		want := fmt.Sprintf("%d:%d", fx.uid, fx.gid)
		for _, p := range []string{filepath.Join(fx.etc, "a"), filepath.Join(fx.etc, "a", "b"), p} {
			if got := owner(t, p); got != want {
				t.Errorf("%s: got owner %s, want %s", p, got, want)
			}
		}
		st, _ := os.Stat(filepath.Join(fx.etc, "a"))
		if st.Mode().Perm() != 0o755 {
			t.Errorf("new directory mode %v, want 0755", st.Mode())
		}
		if st, _ := os.Stat(p); st.Mode().Perm() != 0o644 {
			t.Errorf("new file mode %v, want 0644", st.Mode())
		}
	})

	t.Run("multipart upload into root's 0700 directory", func(t *testing.T) {
		fx := newFixture(t)
		p := filepath.Join(fx.secret, "new")
		ct, body := multipartBody(t, [][2]string{{p, "new"}})
		if resp, b := d.do("POST", filesURL("", u), bytes.NewReader(body), map[string]string{"Content-Type": ct}); resp.StatusCode != http.StatusOK {
			t.Fatalf("got %d %s, want 200", resp.StatusCode, b)
		}
		if got, want := owner(t, p), fmt.Sprintf("%d:%d", fx.uid, fx.gid); got != want {
			t.Errorf("got owner %s, want %s", got, want)
		}
	})

	t.Run("MakeDir, Move and Remove in root's tree", func(t *testing.T) {
		fx := newFixture(t)
		want := fmt.Sprintf("%d:%d", fx.uid, fx.gid)
		dir := filepath.Join(fx.etc, "x", "y")
		if _, err := d.as(u).MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: dir})); err != nil {
			t.Fatalf("MakeDir: %v", err)
		}
		for _, p := range []string{filepath.Join(fx.etc, "x"), dir} {
			if got := owner(t, p); got != want {
				t.Errorf("MakeDir %s: got owner %s, want %s", p, got, want)
			}
		}
		moved := filepath.Join(fx.secret, "m", "passwd")
		if _, err := d.as(u).Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: fx.passwd, Destination: moved})); err != nil {
			t.Fatalf("Move: %v", err)
		}
		if got := owner(t, moved); got != "0:0" {
			t.Errorf("moved file: got owner %s, want root's kept", got)
		}
		if got := owner(t, filepath.Dir(moved)); got != want {
			t.Errorf("directory made for the move: got owner %s, want %s", got, want)
		}
		if _, err := d.as(u).Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: fx.secret})); err != nil {
			t.Fatalf("Remove: %v", err)
		}
		if _, err := os.Lstat(fx.secret); !os.IsNotExist(err) {
			t.Errorf("removed directory still there: %v", err)
		}
	})

	t.Run("a file in the way of a directory", func(t *testing.T) {
		fx := newFixture(t)
		p := filepath.Join(fx.passwd, "sub", "file")
		resp, b := d.do("POST", filesURL(p, u), strings.NewReader("x"), octet)
		errorBody(t, resp, b, http.StatusBadRequest)
		if !strings.Contains(string(b), "not a directory") {
			t.Errorf("got %s, want a not-a-directory message", b)
		}
		_, err := d.as(u).MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: filepath.Join(fx.passwd, "d")}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("MakeDir under a file: got %v, want invalid_argument", err)
		}
	})
}

// Commands still run as their user: a working directory the user cannot
// enter is refused with a message naming the user and the directory.
func TestStartInADirectoryTheUserCannotEnter(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	fx := newFixture(t)
	proc, _ := d.clients(http.Header{"X-Access-Token": {testToken}, "Authorization": {basicUser(unprivileged)}})
	s, err := proc.Start(t.Context(), connect.NewRequest(&procpb.StartRequest{
		Process: &procpb.ProcessConfig{Cmd: "/bin/true", Cwd: proto.String(fx.secret)}}))
	if err == nil {
		for s.Receive() {
		}
		err = s.Err()
		s.Close()
	}
	if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), strconv.Quote(unprivileged)) || !strings.Contains(err.Error(), strconv.Quote(fx.secret)) {
		t.Errorf("got %v, want permission_denied naming %q and %q", err, unprivileged, fx.secret)
	}
}

// Under load, uploads and MakeDirs of root and of the unprivileged user
// interleave in shared new directories: every request succeeds and each
// file is owned by the user that wrote it.
func TestConcurrentUsersOwnWhatTheyWrite(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	fx := newFixture(t)
	const workers, rounds = 16, 20
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		errs = append(errs, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	nobody := fmt.Sprintf("%d:%d", fx.uid, fx.gid)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				u, want := "root", "0:0"
				if (w+r)%2 == 1 {
					u, want = unprivileged, nobody
				}
				// Rounds share their new parent directory across workers.
				p := filepath.Join(fx.etc, fmt.Sprintf("r%d", r), fmt.Sprintf("%s-%d", u, w))
				if r%3 == 0 {
					if _, err := d.as(u).MakeDir(context.Background(), connect.NewRequest(&fspb.MakeDirRequest{Path: p})); err != nil {
						fail("MakeDir %s as %s: %v", p, u, err)
						continue
					}
				} else {
					req, _ := http.NewRequest("POST", d.url+filesURL(p, u), strings.NewReader(u))
					req.Header.Set("X-Access-Token", testToken)
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						fail("upload %s as %s: %v", p, u, err)
						continue
					}
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						fail("upload %s as %s: status %d", p, u, resp.StatusCode)
						continue
					}
				}
				st, err := os.Lstat(p)
				if err != nil {
					fail("%s: %v", p, err)
					continue
				}
				sys := st.Sys().(*syscall.Stat_t)
				if got := fmt.Sprintf("%d:%d", sys.Uid, sys.Gid); got != want {
					fail("%s as %s: got owner %s, want %s", p, u, got, want)
				}
			}
		}()
	}
	wg.Wait()
	for _, e := range errs {
		t.Error(e)
	}
}
