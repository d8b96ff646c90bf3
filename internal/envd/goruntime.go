package envd

import (
	"os"
	"runtime"
)

// TuneRuntime sets envd's own Go runtime for life inside gVisor, where
// every thread of envd is a task of the sentry and, under systrap, a host
// thread (kernel.pid_max bounds the sandboxes a host holds): one P, since
// envd waits on I/O and on its commands and never needs two cores. A
// GOMAXPROCS in the sandbox's environment wins. Commands do not inherit
// any of this: they get the sandbox's environment, not envd's runtime.
func TuneRuntime() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
}
