package server_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/agentenv/agentenv/client"
	fspb "github.com/agentenv/agentenv/client/api/envd/filesystempb"
	"github.com/agentenv/agentenv/client/api/envd/filesystempb/filesystempbconnect"
	procpb "github.com/agentenv/agentenv/client/api/envd/processpb"
	"github.com/agentenv/agentenv/client/api/envd/processpb/processpbconnect"
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

// TestEnvdFileOpsAsTheUser checks, inside gVisor, on busybox and on a GNU
// userland, that envd does what E2B's envd does for a request as "user":
// it acts as root, so "user" writes anywhere (even a new directory under
// "/"), and hands what it creates or overwrites to "user". A command's
// working directory is still checked as its user, and every thread of envd
// ends up root again after that check.
func TestEnvdFileOpsAsTheUser(t *testing.T) {
	e := sharedServer(t)
	for _, tpl := range filesTemplates(t, e) {
		t.Run(tpl, func(t *testing.T) {
			sb := e.create(t, client.CreateRequest{TemplateID: tpl, Timeout: new(int64(120))})
			user, root := e.envdAs(t, sb, "user"), e.envdAs(t, sb, "root")
			ctx := context.Background()
			root.sh(`mkdir -m 700 /secret && echo s > /secret/f && echo r > /etc/agentenv-root`)

			if status, msg := user.files("POST", "/0/x.txt", "mine"); status != http.StatusOK {
				t.Fatalf("write /0/x.txt as user: got %d %q, want 200 (E2B makes /0 for the user)", status, msg)
			}
			if status, msg := user.files("POST", "/etc/agentenv-root", "mine"); status != http.StatusOK {
				t.Errorf("overwrite a root file as user: got %d %q, want 200", status, msg)
			}
			if status, msg := root.files("POST", "/etc/agentenv-by-root", "r"); status != http.StatusOK {
				t.Errorf("write into /etc as root: got %d %q, want 200", status, msg)
			}
			if _, err := user.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "/1/2"})); err != nil {
				t.Errorf("MakeDir /1/2 as user: %v", err)
			}
			if _, err := user.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: "/etc/agentenv-by-root", Destination: "/3/moved"})); err != nil {
				t.Errorf("Move a root file as user: %v", err)
			}
			if status, msg := user.files("GET", "/secret/f", ""); status != http.StatusOK || msg != "s\n" {
				t.Errorf("read /secret/f as user: got %d %q, want 200 %q", status, msg, "s\n")
			}
			if _, err := user.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "/secret", Depth: 1})); err != nil {
				t.Errorf("ListDir of a 0700 root directory as user: %v", err)
			}
			got := root.sh(`stat -c '%n %u:%g %a' /0 /0/x.txt /etc /etc/agentenv-root /1 /1/2 /3 /3/moved`)
			want := "/0 1000:1000 755\n/0/x.txt 1000:1000 644\n/etc 0:0 755\n/etc/agentenv-root 1000:1000 644\n" +
				"/1 1000:1000 755\n/1/2 1000:1000 755\n/3 1000:1000 755\n/3/moved 0:0 644\n"
			if got != want {
				t.Errorf("got owners and modes\n%s, want\n%s", got, want)
			}
			if _, got := root.files("GET", "/0/x.txt", ""); got != "mine" {
				t.Errorf("got /0/x.txt %q, want mine", got)
			}

			// A command runs as its user: a working directory it cannot
			// enter is refused, naming both.
			s, err := user.proc.Start(ctx, connect.NewRequest(&procpb.StartRequest{
				Process: &procpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "true"}, Cwd: proto.String("/secret")}}))
			if err == nil {
				for s.Receive() {
				}
				err = s.Err()
				s.Close()
			}
			if status, msg := connectStatus(err); status != http.StatusForbidden || !strings.Contains(msg, `"user"`) || !strings.Contains(msg, `"/secret"`) {
				t.Errorf("start in /secret as user: got %d %q, want 403 naming user and /secret", status, msg)
			}
			// That check switched one thread and back: every thread of envd
			// (the sandbox's PID 1) is root again.
			if got := root.sh(`grep -h -e '^Uid' -e '^Gid' /proc/1/task/*/status | sort -u | tr -s ' \t' ' '`); got != "Gid: 0 0 0 0\nUid: 0 0 0 0\n" {
				t.Errorf("got envd's thread credentials %q, want all root", got)
			}
		})
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
