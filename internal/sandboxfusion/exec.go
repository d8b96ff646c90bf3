package sandboxfusion

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/agentenv/agentenv/client/api/envd/processpb"
	"github.com/agentenv/agentenv/client/api/envd/processpb/processpbconnect"
)

// stdinChunk is the most stdin one envd request carries.
const stdinChunk = 256 << 10

// capped keeps the first maxOutput bytes written to it.
type capped []byte

func (c *capped) add(b []byte) {
	if room := maxOutput - len(*c); room > 0 {
		*c = append(*c, b[:min(room, len(b))]...)
	}
}

// command runs argv in codeDir through envd, its stdin from stdin (nil:
// none), killed by envd at limit. The process is started directly, with
// no shell or wrapper around it: each extra process costs the call CPU
// in gVisor. Only the first maxOutput bytes of stdout and of stderr are
// kept.
func (c *call) command(ctx context.Context, argv []string, stdin []byte, limit time.Duration) *CommandResult {
	hc, base := c.s.envd.Envd(c.sb)
	pc := processpbconnect.NewProcessClient(hc, base)
	cwd := codeDir
	hasStdin := stdin != nil
	req := connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: argv[0], Args: argv[1:], Cwd: &cwd}, Stdin: &hasStdin})
	// The stream's deadline is the command's: envd kills it then.
	sctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	start := time.Now()
	stream, err := pc.Start(sctx, req)
	if err != nil {
		return errorResult(fmt.Errorf("start %s in the sandbox: %w", argv[0], err))
	}
	defer stream.Close()
	var stdout, stderr capped
	var code *int
	for code == nil && stream.Receive() {
		ev := stream.Msg().GetEvent()
		if st := ev.GetStart(); st != nil && hasStdin {
			// A process may end before it has read all its stdin (or
			// before envd closes it): it is not an error of the call, and
			// the stream still brings its end.
			sendStdin(sctx, pc, st.GetPid(), stdin)
		}
		if d := ev.GetData(); d != nil {
			stdout.add(d.GetStdout())
			stderr.add(d.GetStderr())
		}
		if end := ev.GetEnd(); end != nil {
			n := int(end.GetExitCode())
			code = &n
		}
	}
	took := time.Since(start).Seconds()
	out, errOut := string(stdout), string(stderr)
	err = stream.Err()
	switch {
	case code != nil:
		return &CommandResult{Status: Finished, ExecutionTime: &took, ReturnCode: code, Stdout: &out, Stderr: &errOut}
	case ctx.Err() == nil && (connect.CodeOf(err) == connect.CodeDeadlineExceeded || errors.Is(sctx.Err(), context.DeadlineExceeded)):
		return &CommandResult{Status: TimeLimitExceeded, ExecutionTime: &took, Stdout: &out, Stderr: &errOut}
	case err == nil:
		err = errors.New("the process stream ended without an exit code")
	}
	return errorResult(fmt.Errorf("run %s in the sandbox (it may have passed its memory limit): %w", argv[0], err))
}

// sendStdin writes b to process pid's stdin and closes it.
func sendStdin(ctx context.Context, pc processpbconnect.ProcessClient, pid uint32, b []byte) error {
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}
	for len(b) > 0 {
		n := min(len(b), stdinChunk)
		_, err := pc.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: sel,
			Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: b[:n]}}}))
		if err != nil {
			return err
		}
		b = b[n:]
	}
	_, err := pc.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: sel}))
	return err
}
