package gvisorgo

import (
	"context"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/sentry/control"
	"gvisor.dev/gvisor/pkg/sentry/kernel/auth"
	"gvisor.dev/gvisor/runsc/specutils"

	"github.com/agentenv/agentenv/internal/runtime"
)

// Exec implements runtime.Execer like `runsc exec`: the process gets the
// init process's user, environment, working directory and capabilities,
// /dev/null as stdin and one pipe for stdout and stderr, of which it keeps
// the last runtime.ExecOutputMax bytes.
func (g *Gvisor) Exec(ctx context.Context, id string, args []string) (int, []byte, error) {
	c, err := g.load(id, false)
	if err != nil {
		return 0, nil, err
	}
	if len(args) == 0 {
		return 0, nil, fmt.Errorf("exec in %s: no command", id)
	}
	conf := g.opConf
	p := c.Spec.Process
	caps, err := specutils.Capabilities(conf.EnableRaw, p.Capabilities)
	if err != nil {
		return 0, nil, fmt.Errorf("exec in %s: capabilities: %w", id, err)
	}
	null, err := devNull()
	if err != nil {
		return 0, nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return 0, nil, err
	}
	defer r.Close()
	e := &control.ExecArgs{
		Argv:             args,
		Envv:             p.Env,
		WorkingDirectory: p.Cwd,
		KUID:             auth.KUID(p.User.UID),
		KGID:             auth.KGID(p.User.GID),
		Capabilities:     caps,
		NoNewPrivileges:  p.NoNewPrivileges,
		SupportTTYs:      true,
		FilePayload:      control.NewFilePayload(map[int]*os.File{0: null, 1: w, 2: w}, nil),
	}
	pid, err := c.Execute(conf, e)
	w.Close()
	if err != nil {
		return 0, nil, fmt.Errorf("exec in %s: %w", id, err)
	}
	out := runtime.NewTail(runtime.ExecOutputMax)
	copied := make(chan error, 1)
	go func() {
		_, err := io.Copy(out, r)
		copied <- err
	}()
	// WaitPID is a blocking RPC: on cancellation, kill the process so that
	// it returns.
	stop := context.AfterFunc(ctx, func() { _ = c.SignalProcess(unix.SIGKILL, pid) })
	ws, err := c.WaitPID(pid)
	stop()
	if err != nil {
		return 0, nil, fmt.Errorf("exec in %s: wait for pid %d: %w", id, pid, err)
	}
	// Background children that keep the pipe open hold the output open too
	// (as with `runsc exec`); the context bounds that wait.
	select {
	case <-copied:
	case <-ctx.Done():
		r.Close()
		<-copied
		return 0, out.Bytes(), ctx.Err()
	}
	if err := ctx.Err(); err != nil {
		return 0, out.Bytes(), err
	}
	code := ws.ExitStatus()
	if ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	return code, out.Bytes(), nil
}
