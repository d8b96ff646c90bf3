package sandbox

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/agentenv/agentenv/internal/envdapi"
	"github.com/agentenv/agentenv/internal/envdclient"
	"github.com/agentenv/agentenv/internal/errdefs"
)

// Envd is what the lifecycle asks of a sandbox's daemon. *envdclient.Client
// implements it (the default); a fake lets lifecycle tests run without one.
type Envd interface {
	// Wait returns once envd answers its health check, or ctx ends.
	Wait(ctx context.Context, t envdclient.Target) error
	// Init sets envd's access token and variables (a restored sandbox's).
	Init(ctx context.Context, t envdclient.Target, token string, envs map[string]string) error
	// Changes streams the files changed after since (caller closes, and
	// bounds what it reads).
	Changes(ctx context.Context, t envdclient.Target, since time.Time) (io.ReadCloser, error)
	// PutChanges hands back a stream Changes gave.
	PutChanges(ctx context.Context, t envdclient.Target, r io.Reader, size int64) error
	// Start starts a shell command; wait copies its output to out until
	// it ends and says how ("exit status 0").
	Start(ctx context.Context, t envdclient.Target, cmd, tag string, out io.Writer) (wait func() string, err error)
	// Run runs a shell command to its end and says how it ended.
	Run(ctx context.Context, t envdclient.Target, cmd string, out io.Writer) string
}

var _ Envd = (*envdclient.Client)(nil)

// envdOf is the envd of sb.
func envdOf(sb Sandbox) envdclient.Target {
	return envdclient.Target{Addr: sb.Addr(envdapi.Port), Token: sb.AccessToken}
}

// waitEnvd waits (at most 30 s) until sb's envd answers.
func waitEnvd(ctx context.Context, c Envd, sb Sandbox) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.Wait(ctx, envdOf(sb)); err != nil {
		return fmt.Errorf("envd in sandbox %s did not answer within 30s (%v): %w", sb.ID, err, errdefs.ErrUnavailable)
	}
	return nil
}

// rekey sets a new access token in a restored sandbox's envd, which still
// has oldToken, waiting (at most 30 s, as waitEnvd) for envd to accept the
// connection.
func rekey(ctx context.Context, c Envd, sb Sandbox, oldToken string, envs map[string]string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return c.Init(ctx, envdclient.Target{Addr: sb.Addr(envdapi.Port), Token: oldToken}, sb.AccessToken, envs)
}
