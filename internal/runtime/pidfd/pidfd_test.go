package pidfd_test

import (
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/runtime/pidfd"
)

// A process that exits between Open and WatchFile (a sandbox that dies at
// once, or one killed right after its pidfd was taken) is still seen to
// exit: the pidfd polls readable only once, edge-triggered, and the watch
// must not wait for an edge that came before it started.
func TestWatchSeesAnExitBeforeTheWatch(t *testing.T) {
	const rounds = 50
	for i := range rounds {
		cmd := exec.Command("sleep", "100000")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		f, err := pidfd.Open(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		cmd.Process.Signal(syscall.SIGKILL)
		done, err := pidfd.WatchFile(f, true)
		if err != nil {
			t.Fatal(err)
		}
		// A safety net, not a measurement: the exit has happened already.
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: exit of process %d killed before its watch started: not seen within 30s", i, cmd.Process.Pid)
		}
		// The watch reaped it.
		if err := cmd.Wait(); err == nil {
			t.Errorf("round %d: wait after the watch: got nil, want the child already reaped", i)
		}
	}
}
