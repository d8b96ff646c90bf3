package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/netns"
)

// ServeOptions make Run start its own agentenv server, in a cgroup of its
// own so that its CPU and that of everything it starts can be counted, and
// stop it at the end.
type ServeOptions struct {
	// Binary is the agentenv binary to run `serve` with; empty means Run
	// measures the server Config.Client reaches.
	Binary string
	// NetworkCIDR and NetworkTag are the server's --network-cidr and
	// --network-tag (default serveNetworkCIDR and serveNetworkTag): the
	// bench removes the firewall table of that tag, which a server leaves
	// behind when it stops, and which would refuse the connections of a
	// later server in the same range.
	NetworkCIDR, NetworkTag string
	// Flags are added to serve's command line after the bench's own
	// (--data-dir, --listen, --proxy-listen, --network-cidr, --network-tag,
	// --disk-budget 0): a flag given again wins.
	Flags []string
}

// The network range and tag of the server the bench starts by default:
// apart from serve's defaults and from the ranges the tests use.
const (
	serveNetworkCIDR = "10.226.0.0/20"
	serveNetworkTag  = "bnc"
)

// ownServer is a server the bench started.
type ownServer struct {
	cmd    *exec.Cmd
	net    *netns.Manager
	dir    string
	log    string
	done   chan error
	client *client.Client
}

// startServer starts `agentenv serve` with a fresh data dir on loopback
// ports it picks (port 0), in g when g is not nil, and returns once it
// lists the template.
func startServer(ctx context.Context, o ServeOptions, template string, g *cpuGroup, progress io.Writer) (_ *ownServer, err error) {
	if o.NetworkCIDR == "" {
		o.NetworkCIDR = serveNetworkCIDR
	}
	if o.NetworkTag == "" {
		o.NetworkTag = serveNetworkTag
	}
	nm, err := netns.NewManager(o.NetworkCIDR, o.NetworkTag)
	if err != nil {
		return nil, err
	}
	// A table left by an earlier run that was killed.
	nm.RemoveFirewall(ctx)
	dir, err := os.MkdirTemp("", "agentenv-bench-serve-")
	if err != nil {
		return nil, err
	}
	s := &ownServer{net: nm, dir: dir, log: filepath.Join(dir, "server.log"), done: make(chan error, 1)}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.stop(context.WithoutCancel(ctx)))
		}
	}()
	b := make([]byte, 16)
	rand.Read(b)
	key := hex.EncodeToString(b)
	args := append([]string{"serve", "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0",
		"--network-cidr", o.NetworkCIDR, "--network-tag", o.NetworkTag,
		// Admission counts each write layer at its full size (10 GiB by
		// default): the rollout group's 30-odd sandboxes at once, which
		// write a few KiB each, would not fit this host's disk.
		"--disk-budget", "0"}, o.Flags...)
	fmt.Fprintf(progress, "starting %s %s\n", o.Binary, strings.Join(args, " "))
	log, err := os.Create(s.log)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	// Not CommandContext: Ctrl-C must not kill the server before the
	// bench has killed its sandboxes (it would leave them running).
	s.cmd = exec.Command(o.Binary, args...)
	s.cmd.Env = append(withoutEnv(os.Environ(), "AGENTENV_API_KEY"), "AGENTENV_API_KEY="+key)
	s.cmd.Stdout, s.cmd.Stderr = log, log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	g.attach(s.cmd.SysProcAttr)
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s serve: %w", o.Binary, err)
	}
	go func() { s.done <- s.cmd.Wait() }()
	return s, s.waitReady(ctx, template, key)
}

// servingLine is the line `agentenv serve` logs once it accepts
// connections (server.Front.Serve), with the ports it bound. Ports found
// free and closed before the start could be taken by another program
// while the server prepares its host, seconds before it binds them.
var servingLine = regexp.MustCompile(`msg="agentenv serving" api=(\S+) proxy=(\S+)`)

// sandboxFusionLine is the line a server started with
// --sandboxfusion-listen logs once that service accepts connections.
var sandboxFusionLine = regexp.MustCompile(`msg="sandboxfusion serving" addr=(\S+)`)

// sandboxFusionURL waits for the server's SandboxFusion address in its log.
func (s *ownServer) sandboxFusionURL(ctx context.Context) (string, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		if b, err := os.ReadFile(s.log); err == nil {
			if m := sandboxFusionLine.FindSubmatch(b); m != nil {
				return "http://" + string(m[1]), nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the server logged no SandboxFusion address within a minute of serving%s", s.logTail())
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return "", err
		}
	}
}

// waitReady polls until the server logs its addresses (then s.client is
// set, with key) and lists template.
func (s *ownServer) waitReady(ctx context.Context, template, key string) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		err := errors.New("not serving yet")
		if s.client == nil {
			if b, rerr := os.ReadFile(s.log); rerr == nil {
				if m := servingLine.FindSubmatch(b); m != nil {
					s.client = client.New("http://"+string(m[1]), "http://"+string(m[2]), key)
				}
			}
		}
		if s.client != nil {
			var tpls []client.Template
			tpls, err = s.client.ListTemplates(ctx)
			for _, t := range tpls {
				if err == nil && t.TemplateID == template {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the server did not list template %q within 3 minutes (last error: %v)%s", template, err, s.logTail())
		}
		select {
		case werr := <-s.done:
			s.done <- werr
			return fmt.Errorf("the server exited: %v%s", werr, s.logTail())
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stop stops the server (SIGTERM, then SIGKILL after a minute) and removes
// its firewall table and data dir. Its sandboxes must be gone first: a
// server stopping leaves them running.
func (s *ownServer) stop(ctx context.Context) error {
	var errs []error
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(time.Minute):
			s.cmd.Process.Kill()
			<-s.done
			errs = append(errs, fmt.Errorf("the server did not stop within a minute of SIGTERM; killed%s", s.logTail()))
		case <-ctx.Done():
			s.cmd.Process.Kill()
			<-s.done
		}
	}
	if err := s.net.RemoveFirewall(ctx); err != nil {
		errs = append(errs, fmt.Errorf("remove the server's firewall table: %w", err))
	}
	if err := os.RemoveAll(s.dir); err != nil {
		errs = append(errs, fmt.Errorf("remove the server's data dir: %w", err))
	}
	return errors.Join(errs...)
}

// logTail is the end of the server's log, for error messages.
func (s *ownServer) logTail() string {
	b, err := os.ReadFile(s.log)
	if err != nil || len(b) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return "; server log ends with:\n" + strings.Join(lines[max(0, len(lines)-10):], "\n")
}

func withoutEnv(env []string, name string) []string {
	var out []string
	for _, e := range env {
		if !strings.HasPrefix(e, name+"=") {
			out = append(out, e)
		}
	}
	return out
}
