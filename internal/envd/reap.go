package envd

import (
	"bytes"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// envd is PID 1 of its sandbox, so every process whose parent exits
// (`sh -c "sleep 1 &"`) becomes its child. Unreaped, each stays a zombie
// that counts against the sandbox's process cap, until every fork in it
// fails. The reaper reaps those orphans, and only those: the exit status
// of a process envd started belongs to its exec.Cmd.Wait, which would
// otherwise see ECHILD and lose the command's exit code.

// children is the process-wide table of the processes envd started.
var children = struct {
	// starting is held for reading across each start and its entry in
	// own, and for writing by the reaper while it picks what to reap: so
	// a child that exits at once is in own before the reaper looks.
	starting sync.RWMutex
	mu       sync.Mutex
	own      map[int]bool
}{own: map[int]bool{}}

// startChild starts cmd as one of envd's own children, whose status
// waitChild collects.
func startChild(cmd *exec.Cmd) error {
	children.starting.RLock()
	defer children.starting.RUnlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	children.mu.Lock()
	children.own[cmd.Process.Pid] = true
	children.mu.Unlock()
	return nil
}

// waitChild waits for a command startChild started; its pid is then free
// for the reaper again (the kernel may give it to an orphan).
func waitChild(cmd *exec.Cmd) error {
	err := cmd.Wait()
	children.mu.Lock()
	delete(children.own, cmd.Process.Pid)
	children.mu.Unlock()
	return err
}

// ReapOrphans reaps, for the rest of the process's life, every zombie
// child of envd that envd did not start itself: at once, then at each
// SIGCHLD. envd's main calls it once.
func ReapOrphans() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGCHLD)
	go func() {
		for {
			reapOrphans()
			<-ch // signals coalesce: each pass reaps every zombie there is
		}
	}()
}

// reapOrphans reaps the zombies among envd's children that are not its
// own, and returns how many.
func reapOrphans() int {
	zombies := zombieChildren(os.Getpid())
	if len(zombies) == 0 {
		return 0
	}
	children.starting.Lock()
	defer children.starting.Unlock()
	children.mu.Lock()
	defer children.mu.Unlock()
	n := 0
	for _, pid := range zombies {
		// A zombie's pid is not reused until it is reaped, so one not in
		// own now was never envd's (own children are listed before any
		// start returns, and the reaper holds starts off).
		if children.own[pid] {
			continue
		}
		var ws unix.WaitStatus
		if got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err == nil && got == pid {
			n++
		}
	}
	return n
}

// zombieChildren lists the processes in /proc that are zombies whose
// parent is ppid.
func zombieChildren(ppid int) []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	var out []int
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + name + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		if state, parent, ok := parseStat(b); ok && state == 'Z' && parent == ppid {
			out = append(out, pid)
		}
	}
	return out
}

// parseStat reads the state and parent pid of /proc/<pid>/stat:
// "pid (comm) S ppid ...", where comm may hold spaces and parentheses.
func parseStat(b []byte) (state byte, ppid int, ok bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, false
	}
	ppid, err := strconv.Atoi(string(f[1]))
	if err != nil {
		return 0, 0, false
	}
	return f[0][0], ppid, true
}
