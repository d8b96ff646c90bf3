// Package childproc starts the server's child processes. It once kept them
// from starting while gVisor's in-process create had moved the whole server
// into a new sandbox's cgroups (cgroup v1); creates now run in worker
// processes (internal/runtime/gvisorgo), so these are plain os/exec calls,
// kept so that callers need not change at once. New code may use os/exec
// directly. It must not do anything else.
package childproc

import (
	"bytes"
	"os/exec"
)

// Start is cmd.Start.
func Start(cmd *exec.Cmd) error { return cmd.Start() }

// Run starts cmd and waits for it.
func Run(cmd *exec.Cmd) error {
	if err := Start(cmd); err != nil {
		return err
	}
	return cmd.Wait()
}

// Output is exec.Cmd.Output through Start.
func Output(cmd *exec.Cmd) ([]byte, error) {
	var out bytes.Buffer
	cmd.Stdout = &out
	err := Run(cmd)
	return out.Bytes(), err
}

// CombinedOutput is exec.Cmd.CombinedOutput through Start.
func CombinedOutput(cmd *exec.Cmd) ([]byte, error) {
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := Run(cmd)
	return out.Bytes(), err
}
