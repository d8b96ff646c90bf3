// Command seccompgen renders runsc's precompiled seccomp filter files into a
// gVisor module tree, in place (see internal/runscbuild/seccompgen). The
// runsc build runs it inside the module copy it builds, so that the programs
// come from that copy; run elsewhere, it renders the programs of the gVisor
// it was built with.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/agentenv/agentenv/internal/runscbuild/seccompgen"
)

func main() {
	src := flag.String("src", "", "root of a writable gVisor module tree whose stub filter files are replaced")
	all := flag.Bool("all", false, "register every precompiled program, as upstream does, not only those agentenv's sandboxes can use")
	flag.Parse()
	if *src == "" {
		fmt.Fprintln(os.Stderr, "usage: seccompgen -src DIR")
		os.Exit(2)
	}
	if err := seccompgen.Generate(*src, *all, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "seccompgen:", err)
		os.Exit(1)
	}
}
