package sandboxfusion

import (
	"fmt"
	"sort"
	"strings"
)

// language is how one of SandboxFusion's languages runs in the runner
// template: the file the code is written to, the compile command (none
// for interpreters) and the run command, each started in the code's
// directory (no shell: absolute paths). limitAS says whether memory_limit_MB may be set
// as the address-space limit of the run (RLIMIT_AS); nodejs reserves far
// more address space than it uses, so it gets V8's heap limit instead and
// the sandbox's own memory limit behind it.
type language struct {
	file    string
	compile []string
	run     []string
	limitAS bool
	// heapFlag, when set, is a run option taking the limit in MiB.
	heapFlag string
}

// languages are the languages the runner template has toolchains for
// (RunnerPackages): python3, g++, nodejs, and Debian's essential bash and
// perl.
var languages = map[string]language{
	"python": {file: "main.py", run: []string{"/usr/bin/python3", "main.py"}, limitAS: true},
	"cpp": {file: "main.cpp", compile: []string{"/usr/bin/g++", "-std=c++17", "-O2", "main.cpp", "-o", "main", "-lpthread"},
		run: []string{codeDir + "/main"}, limitAS: true},
	"nodejs": {file: "main.js", run: []string{"/usr/bin/node", "main.js"}, heapFlag: "--max-old-space-size="},
	"bash":   {file: "main.sh", run: []string{"/bin/bash", "main.sh"}, limitAS: true},
	"perl":   {file: "main.pl", run: []string{"/usr/bin/perl", "main.pl"}, limitAS: true},
}

// RunnerPackages are the Debian packages of the runner template, beside
// debootstrap's minimal base (which has bash and perl). matplotlib is left
// out although /run_jupyter turns its figures into PNGs: Debian's package
// installs a .pth file that every Python start runs (importing
// importlib.util), which cost ~18 ms of CPU per python3 start in a runner
// (+42 %), on every /run_code call. A runner built with it
// (--sandboxfusion-template) gets the figures.
var RunnerPackages = []string{"python3", "g++", "nodejs"}

// Languages lists the languages this service runs, sorted.
func Languages() []string {
	out := make([]string, 0, len(languages))
	for name := range languages {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// lookupLanguage finds name, or says which languages there are.
func lookupLanguage(name string) (language, error) {
	l, ok := languages[name]
	if !ok {
		if name == "" {
			return language{}, fmt.Errorf("no language given: set \"language\" to one of %s", strings.Join(Languages(), ", "))
		}
		return language{}, fmt.Errorf("language %q is not supported by this server: it runs %s", name, strings.Join(Languages(), ", "))
	}
	return l, nil
}
