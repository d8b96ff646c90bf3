// Command runscbuild builds agentenv's runsc: the pinned gVisor module with
// patches/gvisor applied and precompiled seccomp filters (see
// internal/runscbuild). scripts/setup.sh runs it, checks the binary and
// installs it; this command installs nothing.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/agentenv/agentenv/internal/runscbuild"
)

func main() {
	version := flag.String("version", "", "gVisor module version to build (RUNSC_VERSION)")
	patches := flag.String("patches", "", "directory whose *.patch files are applied in name order")
	work := flag.String("work", "", "scratch directory of the build (keep one path: builds there are incremental)")
	out := flag.String("out", "", "path of the runsc binary to write")
	stub := flag.Bool("stub", false, "keep the stub seccomp filters (runsc compiles them at each start), for comparisons")
	repo := flag.String("repo", ".", "the agentenv checkout (its seccomp generator renders the filters)")
	flag.Parse()
	if *version == "" || *work == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: runscbuild -version V -work DIR -out FILE [-patches DIR] [-stub]")
		os.Exit(2)
	}
	var files []string
	if *patches != "" {
		var err error
		if files, err = filepath.Glob(filepath.Join(*patches, "*.patch")); err != nil {
			fmt.Fprintln(os.Stderr, "runscbuild:", err)
			os.Exit(2)
		}
		sort.Strings(files)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := runscbuild.Build(ctx, runscbuild.Options{
		Version: strings.TrimSpace(*version), Patches: files, Stub: *stub,
		Work: *work, Out: *out, Log: os.Stderr, Repo: *repo,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
