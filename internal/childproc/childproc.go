// Package childproc starts the server's child processes at moments when
// the server is in its own cgroups. gVisor's in-process create (cgroup v1)
// moves the whole server into the new sandbox's cgroups for a few tens of
// milliseconds; a child started then would stay in the sandbox's cgroups
// (counted against its limits, killed with it). The runtime holds Exclusive
// around such moves; everyone else starts children through Start.
// It must not do anything else.
package childproc

import (
	"bytes"
	"os/exec"
	"sync"
)

var mu sync.RWMutex

// Lock is held by code that moves this process between cgroups; no child
// starts meanwhile.
func Lock() { mu.Lock() }

// Unlock ends Lock.
func Unlock() { mu.Unlock() }

// Start starts cmd outside any cgroup move.
func Start(cmd *exec.Cmd) error {
	mu.RLock()
	defer mu.RUnlock()
	return cmd.Start()
}

// Run starts cmd outside any cgroup move and waits for it.
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
