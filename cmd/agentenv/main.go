// Command agentenv is the agentenv server and CLI (see internal/cli).
package main

import (
	"context"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"agentenv/internal/cli"
)

// The main goroutine keeps the main thread for itself: gVisor's Go packages
// take "the process's namespace" from /proc/self (the main thread) when
// they join and leave a sandbox's network namespace, so no other goroutine
// (such as one creating a namespace) may ever run on the main thread.
func init() { runtime.LockOSThread() }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}
