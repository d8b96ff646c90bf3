package server_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"agentenv/internal/client"
	fspb "agentenv/internal/envd/gen/filesystempb"
	"agentenv/internal/envd/gen/filesystempb/filesystempbconnect"
	procpb "agentenv/internal/envd/gen/processpb"
	"agentenv/internal/envd/gen/processpb/processpbconnect"
)

// envdAs talks to a sandbox's envd as one user of the sandbox, as the E2B
// SDK does (HTTP basic auth user for Connect, ?username= for /files).
type envdAs struct {
	t    *testing.T
	user string
	hc   *http.Client
	base string
	fs   filesystempbconnect.FilesystemClient
	proc processpbconnect.ProcessClient
}

type basicAuth struct {
	base http.RoundTripper
	user string
}

func (b basicAuth) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(b.user+":")))
	return b.base.RoundTrip(r)
}

func (e *env) envdAs(t *testing.T, sb client.Sandbox, user string) *envdAs {
	hc, base := e.client.Envd(sb)
	hc = &http.Client{Transport: basicAuth{base: hc.Transport, user: user}}
	return &envdAs{t: t, user: user, hc: hc, base: base,
		fs:   filesystempbconnect.NewFilesystemClient(hc, base),
		proc: processpbconnect.NewProcessClient(hc, base)}
}

// files sends a /files request and returns its status and body (for an
// error, its message).
func (a *envdAs) files(method, path, body string) (int, string) {
	a.t.Helper()
	q := url.Values{"path": {path}, "username": {a.user}}
	req, err := http.NewRequest(method, a.base+"/files?"+q.Encode(), strings.NewReader(body))
	if err != nil {
		a.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := a.hc.Do(req)
	if err != nil {
		a.t.Fatalf("%s /files %s as %s: %v", method, path, a.user, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e struct{ Message string }
	if resp.StatusCode != http.StatusOK && json.Unmarshal(b, &e) == nil {
		return resp.StatusCode, e.Message
	}
	return resp.StatusCode, string(b)
}

// sh runs a script as the user and returns its stdout.
func (a *envdAs) sh(script string) string {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := a.proc.Start(ctx, connect.NewRequest(&procpb.StartRequest{
		Process: &procpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}}, Stdin: proto.Bool(false)}))
	if err != nil {
		a.t.Fatalf("start %q as %s: %v", script, a.user, err)
	}
	defer s.Close()
	var out strings.Builder
	for s.Receive() {
		ev := s.Msg().GetEvent()
		out.Write(ev.GetData().GetStdout())
		if end := ev.GetEnd(); end != nil && end.GetExitCode() != 0 {
			a.t.Fatalf("%q as %s: exit %d (%s)", script, a.user, end.GetExitCode(), out.String())
		}
	}
	if err := s.Err(); err != nil {
		a.t.Fatalf("%q as %s: %v", script, a.user, err)
	}
	return out.String()
}

// TestEnvdFileOpsRunAsTheUser checks, inside gVisor, that envd makes every
// file operation with the credentials of the user the request names: the
// sandbox's kernel refuses "user" what root owns, symlinks planted by the
// user lead nowhere else, and envd's threads all end up root again.
func TestEnvdFileOpsRunAsTheUser(t *testing.T) {
	e := sharedServer(t)
	sb := e.create(t, client.CreateRequest{})
	user, root := e.envdAs(t, sb, "user"), e.envdAs(t, sb, "root")
	ctx := context.Background()

	root.sh(`mkdir -m 700 /secret && echo s > /secret/f`)
	user.sh(`ln -s /etc /home/user/link`)
	_, passwd := root.files("GET", "/etc/passwd", "")
	if !strings.Contains(passwd, "root:x:0:0") {
		t.Fatalf("got /etc/passwd %q, want root's entry in it", passwd)
	}

	denied := []struct {
		name, path string
		do         func() (int, string)
	}{
		{"upload over /etc/passwd", "/etc/passwd", func() (int, string) { return user.files("POST", "/etc/passwd", "owned") }},
		{"upload through a symlinked parent", "/home/user/link/passwd", func() (int, string) {
			return user.files("POST", "/home/user/link/passwd", "owned")
		}},
		{"upload into a new directory in /etc", "/etc/new/file", func() (int, string) { return user.files("POST", "/etc/new/file", "x") }},
		{"download from a 0700 root directory", "/secret/f", func() (int, string) { return user.files("GET", "/secret/f", "") }},
		{"Remove /etc/passwd", "/etc/passwd", func() (int, string) {
			_, err := user.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "/etc/passwd"}))
			return connectStatus(err)
		}},
		{"Move /etc/passwd", "/home/user/passwd", func() (int, string) {
			_, err := user.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: "/etc/passwd", Destination: "/home/user/passwd"}))
			return connectStatus(err)
		}},
		{"MakeDir through a symlinked parent", "/home/user/link/newdir", func() (int, string) {
			_, err := user.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "/home/user/link/newdir"}))
			return connectStatus(err)
		}},
		{"ListDir of a 0700 root directory", "/secret", func() (int, string) {
			_, err := user.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "/secret", Depth: 1}))
			return connectStatus(err)
		}},
		{"Stat in a 0700 root directory", "/secret/f", func() (int, string) {
			_, err := user.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/secret/f"}))
			return connectStatus(err)
		}},
	}
	for _, tt := range denied {
		t.Run(tt.name, func(t *testing.T) {
			status, msg := tt.do()
			if status != http.StatusForbidden || !strings.Contains(msg, `"user"`) || !strings.Contains(msg, fmt.Sprintf("%q", tt.path)) {
				t.Errorf("as user: got %d %q, want 403 naming user and %q", status, msg, tt.path)
			}
		})
	}
	if _, got := root.files("GET", "/etc/passwd", ""); got != passwd {
		t.Errorf("got /etc/passwd %q after the refused requests, want it unchanged: %q", got, passwd)
	}
	if got := root.sh(`ls -A /etc | grep -c '^new$' || true; ls -A /home/user`); got != "0\nlink\n" {
		t.Errorf("got %q from listing /etc/new and /home/user, want nothing created: %q", got, "0\nlink\n")
	}

	// Allowed: root anywhere, user in its home; what is created is theirs.
	if status, msg := root.files("GET", "/secret/f", ""); status != http.StatusOK || msg != "s\n" {
		t.Errorf("download /secret/f as root: got %d %q, want 200 %q", status, msg, "s\n")
	}
	if status, msg := root.files("POST", "/etc/agentenv-root", "r"); status != http.StatusOK {
		t.Errorf("upload into /etc as root: got %d %q, want 200", status, msg)
	}
	if status, msg := user.files("POST", "/home/user/a/b/f", "u"); status != http.StatusOK {
		t.Errorf("upload into its home as user: got %d %q, want 200", status, msg)
	}
	got := root.sh(`stat -c '%n %u:%g' /etc/agentenv-root /home/user/a /home/user/a/b /home/user/a/b/f`)
	want := "/etc/agentenv-root 0:0\n/home/user/a 1000:1000\n/home/user/a/b 1000:1000\n/home/user/a/b/f 1000:1000\n"
	if got != want {
		t.Errorf("got owners\n%s, want\n%s", got, want)
	}

	// Each switch was on one thread and undone: every thread of envd (the
	// sandbox's PID 1) is root again.
	if got := root.sh(`grep -h -e '^Uid' -e '^Gid' /proc/1/task/*/status | sort -u | tr -s ' \t' ' '`); got != "Gid: 0 0 0 0\nUid: 0 0 0 0\n" {
		t.Errorf("got envd's thread credentials %q, want all root", got)
	}
}

// connectStatus turns a Connect error into an HTTP-like status and message.
func connectStatus(err error) (int, string) {
	if err == nil {
		return http.StatusOK, ""
	}
	switch connect.CodeOf(err) {
	case connect.CodePermissionDenied:
		return http.StatusForbidden, err.Error()
	case connect.CodeNotFound:
		return http.StatusNotFound, err.Error()
	}
	return http.StatusInternalServerError, err.Error()
}
