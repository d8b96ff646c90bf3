// Package envdclient is the server side's client of envd, the daemon inside
// every sandbox: wait for its health, set a restored sandbox's access token
// (/init), run a command and collect its output, and move a sandbox's
// changed files out and back (envdapi.ChangesPath). Every caller on the host
// (the sandbox lifecycle, recovery, a template's start command, a pause
// without memory) goes through it.
//
// It owns the HTTP and Connect details of those calls and nothing else: it
// must not know sandboxes, states or records (callers pass an address and a
// token), and the in-sandbox daemon (internal/envd) must never import it.
package envdclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/agentenv/agentenv/client/api/envd/processpb"
	"github.com/agentenv/agentenv/client/api/envd/processpb/processpbconnect"
	"github.com/agentenv/agentenv/internal/dialer"
	"github.com/agentenv/agentenv/internal/envdapi"
)

// DialFunc opens a connection to a sandbox (the server's marked dialer:
// the host firewall refuses connections to sandboxes without its mark).
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Target is one sandbox's envd: its host-reachable address and the access
// token its requests carry.
type Target struct {
	// Addr is host:port of envd (envdapi.Port on the sandbox's address).
	Addr  string
	Token string
}

func (t Target) url(path string) string { return "http://" + t.Addr + path }

// Client talks to the envd of any sandbox. Its zero value is not usable;
// call New. It is safe for concurrent use.
type Client struct {
	// long serves streams (files, commands): no overall timeout, the
	// caller's context bounds them; no kept connections (an address passes
	// to another sandbox after a kill). Quick calls (health, init) use a
	// connection of their own each.
	long *http.Client
	dial DialFunc
	log  *slog.Logger
}

// New returns a client that opens its connections with dial (nil: a plain
// unmarked dialer.Dialer) and logs its retries at debug level to log (nil: the default).
func New(dial DialFunc, log *slog.Logger) *Client {
	if dial == nil {
		dial = dialer.New(nil).DialContext
	}
	if log == nil {
		log = slog.Default()
	}
	tr := &http.Transport{DisableKeepAlives: true, DialContext: dial}
	return &Client{
		long: &http.Client{Transport: tr},
		dial: dial,
		log:  log,
	}
}

// Wait returns once envd's /health answers 2xx, or ctx ends; the error
// then carries the last failure, the first, and how many attempts failed
// (a refusal at first and a timeout at the end tell envd started and then
// stopped answering from a timeout all along). A refused connection (envd not listening
// yet) is tried again after a short delay; an accepted one waits for the
// answer: envd listens before its slow start-up (internal/envd/listener), so
// the sandbox's network stack holds the connection until envd serves.
func (c *Client) Wait(ctx context.Context, t Target) error {
	return c.retry(ctx, t, "envd not answering yet", func(dialFor time.Duration) error {
		return c.health(ctx, t, dialFor)
	})
}

// retry calls try until it succeeds or ctx ends, with a short delay between
// calls, each call's dial deadline growing (dialFor); the error then carries
// the last failure, the first, and how many attempts failed.
func (c *Client) retry(ctx context.Context, t Target, what string, try func(dialFor time.Duration) error) error {
	delay := time.Millisecond
	// Each connect gets a short deadline that grows: a SYN that reaches a
	// sandbox still finishing its start (or restore) is dropped, and the
	// kernel would retry it only after a full second.
	dialFor := 50 * time.Millisecond
	var first, last error
	failed := 0
	for {
		err := try(dialFor)
		if err == nil {
			return nil
		}
		c.log.Debug(what, "addr", t.Addr, "attempt", dialFor, "err", err)
		if dialFor < 2*time.Second {
			dialFor *= 2
		}
		if failed++; first == nil {
			first = err
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("last error: %v (%d attempts failed; the first: %v)", last, failed, first)
		case <-time.After(delay):
		}
		if delay < 20*time.Millisecond {
			delay *= 2
		}
	}
}

// dialWithin connects to envd within dialFor.
func (c *Client) dialWithin(ctx context.Context, t Target, dialFor time.Duration) (net.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, dialFor)
	defer cancel()
	return c.dial(dctx, "tcp", t.Addr)
}

// exchange sends req on conn and reads its answer, within answerFor (and
// ctx); the caller closes conn.
func exchange(ctx context.Context, conn net.Conn, req *http.Request, answerFor time.Duration) (*http.Response, error) {
	deadline := time.Now().Add(answerFor)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req.Close = true
	if err := req.Write(conn); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	return resp, nil
}

// shortTimeout bounds the answer to a quick call (a restored sandbox's
// /init) once connected. It takes milliseconds, but it is not retried: a
// loaded host that stalls a freshly restored sandbox for a few seconds
// must not fail the restore (the old 2 s left no margin for that).
const shortTimeout = 10 * time.Second

// healthAnswerTimeout bounds the wait for /health's answer on an accepted
// connection: envd's start inside gVisor takes tens of ms, longer on a
// loaded host.
const healthAnswerTimeout = 2 * time.Second

// health asks envd's /health once on a new connection (dialled within
// dialFor), waiting up to healthAnswerTimeout for the answer.
func (c *Client) health(ctx context.Context, t Target, dialFor time.Duration) error {
	conn, err := c.dialWithin(ctx, t, dialFor)
	if err != nil {
		return err
	}
	defer conn.Close()
	req, _ := http.NewRequest(http.MethodGet, t.url("/health"), nil)
	resp, err := exchange(ctx, conn, req, healthAnswerTimeout)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// Init gives envd a new access token and environment variables (a
// restored sandbox's), authenticated with the token it has (t.Token). It
// connects as Wait does (a refused or unanswered connect is tried again
// until ctx ends), so a restored sandbox needs no /health first; once
// connected it sends the request once and waits up to shortTimeout for the
// answer (not retried: envd may have taken it).
func (c *Client) Init(ctx context.Context, t Target, token string, envs map[string]string) error {
	var conn net.Conn
	err := c.retry(ctx, t, "envd not accepting /init yet", func(dialFor time.Duration) (err error) {
		conn, err = c.dialWithin(ctx, t, dialFor)
		return err
	})
	if err != nil {
		return fmt.Errorf("set the access token of restored envd: %w", err)
	}
	defer conn.Close()
	body, _ := jsonBody(map[string]any{"accessToken": token, "envVars": envs})
	req, err := http.NewRequest(http.MethodPost, t.url("/init"), body)
	if err != nil {
		return err
	}
	req.Header.Set("X-Access-Token", t.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := exchange(ctx, conn, req, shortTimeout)
	if err != nil {
		return fmt.Errorf("set the access token of restored envd: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("set the access token of restored envd: HTTP %d", resp.StatusCode)
	}
	return nil
}

// Changes opens envd's stream of the files changed after since and the
// list of all paths (envdapi.ChangesPath). The caller closes it, and bounds
// what it reads: the sandbox decides what it streams.
func (c *Client) Changes(ctx context.Context, t Target, since time.Time) (io.ReadCloser, error) {
	q := url.Values{"since": {strconv.FormatInt(since.UnixNano(), 10)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.url(envdapi.ChangesPath+"?"+q.Encode()), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Access-Token", t.Token)
	resp, err := c.long.Do(req)
	if err != nil {
		return nil, fmt.Errorf("ask envd for the changed files: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, refused("ask envd for the changed files", resp)
	}
	return resp.Body, nil
}

// PutChanges hands envd a stream Changes gave (size bytes), which it
// unpacks over its tree, deleting the paths the stream does not list.
func (c *Client) PutChanges(ctx context.Context, t Target, r io.Reader, size int64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url(envdapi.ChangesPath), r)
	if err != nil {
		return err
	}
	req.ContentLength = size
	req.Header.Set("X-Access-Token", t.Token)
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := c.long.Do(req)
	if err != nil {
		return fmt.Errorf("hand the files to envd: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return refused("hand the files to envd", resp)
	}
	return nil
}

// Start starts cmd under /bin/sh -c (without stdin; tag, if set, names the
// process in envd) and returns wait, which copies the command's stdout and
// stderr to out until it ends and says how it ended ("exit status 0" for
// a success). envd ends the command when ctx ends; wait must be called
// once.
func (c *Client) Start(ctx context.Context, t Target, cmd, tag string, out io.Writer) (wait func() string, err error) {
	pc := processpbconnect.NewProcessClient(c.long, "http://"+t.Addr)
	no := false
	msg := &processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", cmd}}, Stdin: &no}
	if tag != "" {
		msg.Tag = &tag
	}
	req := connect.NewRequest(msg)
	req.Header().Set("X-Access-Token", t.Token)
	stream, err := pc.Start(ctx, req)
	if err != nil {
		return nil, err
	}
	return func() string {
		defer stream.Close()
		return drain(stream, out)
	}, nil
}

// Run runs cmd (as Start) until it ends and says how it ended.
func (c *Client) Run(ctx context.Context, t Target, cmd string, out io.Writer) string {
	wait, err := c.Start(ctx, t, cmd, "", out)
	if err != nil {
		return err.Error()
	}
	return wait()
}

// drain reads a process stream into out and returns how it ended.
func drain(stream *connect.ServerStreamForClient[processpb.StartResponse], out io.Writer) string {
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			out.Write(d.GetStdout())
			out.Write(d.GetStderr())
		}
		if end := ev.GetEnd(); end != nil {
			if end.GetError() != "" {
				return end.GetError()
			}
			return end.GetStatus()
		}
	}
	if err := stream.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return "stream: " + err.Error()
	}
	return "stream ended"
}

// refused reports envd's refusal with at most a short part of its body.
func refused(what string, resp *http.Response) error {
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return fmt.Errorf("%s: HTTP %d: %s", what, resp.StatusCode, strings.TrimSpace(string(msg)))
}

func jsonBody(v any) (io.Reader, error) {
	b, err := json.Marshal(v)
	return bytes.NewReader(b), err
}
