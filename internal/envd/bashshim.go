package envd

import (
	"bytes"
	"os"
	"sync"
	"syscall"

	"github.com/agentenv/agentenv/internal/envdapi"
)

// BashShim is the /bin/bash the host puts in a template without bash
// (envdapi.BashShim).
const BashShim = envdapi.BashShim

// bashShimPath is where the shim is found; shimTarget is what it runs.
var (
	bashShimPath = "/bin/bash"
	shimTarget   = "/bin/sh"
)

// shimCache remembers the file last found to be the shim, by its identity,
// so that each command costs one lstat, not a read.
var shimCache struct {
	sync.Mutex
	dev, ino uint64
	mtime    syscall.Timespec
	ok       bool
}

// commandPath is the program envd starts for a command: /bin/sh when the
// command is /bin/bash and that file is agentenv's shim, which would only
// exec /bin/sh with the same arguments (argv[0] "/bin/sh" included); the
// command itself otherwise. Under gVisor that saves an execve per SDK
// command (the kernel loading sh to read the script, then the script's
// exec of sh), about a third of `commands.run("true")` on busybox.
func commandPath(cmd string) string {
	if cmd != bashShimPath || !isBashShim() {
		return cmd
	}
	return shimTarget
}

func isBashShim() bool {
	var st syscall.Stat_t
	if err := syscall.Lstat(bashShimPath, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG || st.Size != int64(len(BashShim)) {
		return false
	}
	shimCache.Lock()
	defer shimCache.Unlock()
	if shimCache.ok && shimCache.dev == st.Dev && shimCache.ino == st.Ino && shimCache.mtime == st.Mtim {
		return true
	}
	b, err := os.ReadFile(bashShimPath)
	if err != nil || !bytes.Equal(b, []byte(BashShim)) {
		shimCache.ok = false
		return false
	}
	shimCache.dev, shimCache.ino, shimCache.mtime, shimCache.ok = st.Dev, st.Ino, st.Mtim, true
	return true
}
