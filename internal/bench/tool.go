package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// errToolMissing marks a raw runtime that is not installed.
var errToolMissing = errors.New("not installed")

// tool runs one container CLI (runsc or crun) with fixed global flags.
//
// Every child gets files for stdio, never pipes: a runsc sandbox (and a
// crun container's init) inherits the stdio of the command that started
// it, so a pipe there would never reach EOF and the caller would hang.
// Output goes to one log file opened with O_APPEND, because a sandbox
// writes at its own file offset and would clobber other writers otherwise.
type tool struct {
	bin    string
	global []string
	log    *os.File
	// start starts a command; crun's starts it from a thread in a private
	// mount namespace. Nil means cmd.Start.
	start func(*exec.Cmd) error
	// cg, when not nil, is the cgroup every command starts in, so that its
	// CPU and that of what it leaves running is counted.
	cg *cpuGroup
}

func newTool(bin, logPath string, global ...string) (*tool, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", bin, errToolMissing)
	}
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	return &tool{bin: path, global: global, log: log}, nil
}

// run runs `bin global... args...`. stdin and stdout may be nil (stdin then
// reads /dev/null, stdout goes to the log).
func (t *tool) run(ctx context.Context, stdin, stdout *os.File, args ...string) error {
	var from int64
	if st, err := t.log.Stat(); err == nil {
		from = st.Size()
	}
	cmd := exec.CommandContext(ctx, t.bin, append(append([]string{}, t.global...), args...)...)
	if stdin != nil {
		cmd.Stdin = stdin
	}
	cmd.Stdout, cmd.Stderr = t.log, t.log
	if stdout != nil {
		cmd.Stdout = stdout
	}
	// Own process group: Ctrl-C in the terminal reaches only us, and we
	// tear down in order instead of racing half-dead children.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	t.cg.attach(cmd.SysProcAttr)
	start := t.start
	if start == nil {
		start = (*exec.Cmd).Start
	}
	err := start(cmd)
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w%s", filepath.Base(t.bin), strings.Join(args, " "), err, t.since(from))
	}
	return nil
}

// since returns what the log got from offset from on, for error messages.
func (t *tool) since(from int64) string {
	f, err := os.Open(t.log.Name())
	if err != nil {
		return ""
	}
	defer f.Close()
	b, _ := io.ReadAll(io.NewSectionReader(f, from, 4096))
	if s := strings.TrimSpace(string(b)); s != "" {
		return ": " + s
	}
	return ""
}

func (t *tool) close() error { return t.log.Close() }
