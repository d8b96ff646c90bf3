// Command memhog allocates the MiB its argument names and touches every
// page from user space, as Python's bytearray(n) does: a test's stand-in
// for model code that runs out of memory.
package main

import (
	"fmt"
	"os"
	"strconv"
)

func main() {
	mib, err := strconv.Atoi(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "usage: memhog MIB")
		os.Exit(2)
	}
	b := make([]byte, mib<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	fmt.Println("allocated", mib, "MiB")
}
