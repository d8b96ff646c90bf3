// Package seccompgen renders the precompiled seccomp filter files of runsc,
// which upstream makes with a Bazel-only rule (precompiled_seccomp_rules):
// a `go install`ed runsc ships their stubs and compiles its filters at every
// sandbox start. The programs come from the gVisor packages this package is
// linked with, so it must be built against the module it renders into (the
// runsc build runs it inside the patched module copy; see runscbuild). It
// imports only the standard library and gVisor, and writes nothing else.
package seccompgen

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
	sentryconfig "gvisor.dev/gvisor/runsc/boot/filter/config"
	goferconfig "gvisor.dev/gvisor/runsc/fsgofer/filter/config"
)

// Target is one generated file of the gVisor module: the stub that ships in
// the module at File, to be replaced by the same file with Programs in it.
type Target struct {
	File     string // slash-separated path inside the module
	Programs func() ([]precompiledseccomp.Program, error)
}

// Targets are the files upstream's precompiled_seccomp_rules renders for
// runsc: the sentry's filters and the gofer's.
var Targets = []Target{
	{File: "runsc/boot/filter/filter_precompiled.go", Programs: sentryconfig.PrecompiledPrograms},
	{File: "runsc/fsgofer/filter/filter_precompiled.go", Programs: goferconfig.PrecompiledPrograms},
}

// Lines of the stub that rendering changes. The stub is what upstream's
// generator writes when precompilation is disabled, so the rendered file
// differs from it only here, as the generator's enabled output does.
const (
	disabledLine   = "const PrecompilationDisabledAtBuildTime = true"
	enabledLine    = "const PrecompilationDisabledAtBuildTime = false"
	mapLine        = "\tprograms := make(map[string]precompiledseccomp.Program)"
	assignLine     = "\tprecompiledPrograms = programs"
	importLine     = "\t\"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp\""
	programsMapVar = "programs"
	programsPkg    = "precompiledseccomp"
)

// Render returns the stub file with programs registered in it, sorted by
// name, and precompilation marked enabled: byte for byte what upstream's
// rule writes for the same programs. It refuses a file that is not the stub
// (an already rendered one included) and duplicate program names.
func Render(stub []byte, programs []precompiledseccomp.Program) ([]byte, error) {
	lines := bytes.Split(stub, []byte("\n"))
	disabled, mapAt := -1, -1
	hasImport := false
	for i, l := range lines {
		switch string(l) {
		case disabledLine:
			if disabled >= 0 {
				return nil, fmt.Errorf("stub declares PrecompilationDisabledAtBuildTime twice")
			}
			disabled = i
		case mapLine:
			if mapAt >= 0 {
				return nil, fmt.Errorf("stub makes the programs map twice")
			}
			mapAt = i
		case importLine:
			hasImport = true
		}
	}
	switch {
	case disabled < 0:
		return nil, fmt.Errorf("not a stub: no line %q (already rendered?)", disabledLine)
	case mapAt < 0 || mapAt+1 >= len(lines) || string(lines[mapAt+1]) != assignLine:
		return nil, fmt.Errorf("not a stub: registerPrograms is not %q followed by %q", mapLine, assignLine)
	case !hasImport:
		return nil, fmt.Errorf("stub does not import precompiledseccomp unaliased")
	}

	sorted := append([]precompiledseccomp.Program(nil), programs...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	for i := 1; i < len(sorted); i++ {
		if sorted[i].Name == sorted[i-1].Name {
			return nil, fmt.Errorf("duplicate program name %q", sorted[i].Name)
		}
	}

	var out bytes.Buffer
	out.Grow(len(stub) + 16*len(sorted)*1024)
	for i, l := range lines {
		if i > 0 {
			out.WriteByte('\n')
		}
		if i == disabled {
			out.WriteString(enabledLine)
			continue
		}
		out.Write(l)
		if i == mapAt {
			for _, p := range sorted {
				out.WriteByte('\n')
				// Registration ends with a newline; the line join adds ours.
				out.WriteString(p.Registration("\t", programsPkg, programsMapVar))
				out.Truncate(out.Len() - 1)
			}
		}
	}
	return out.Bytes(), nil
}

// Generate renders every Target in the gVisor module tree at root, in
// place, and logs one line per file to log.
func Generate(root string, log io.Writer) error {
	for _, t := range Targets {
		file := filepath.Join(root, filepath.FromSlash(t.File))
		stub, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		programs, err := t.Programs()
		if err != nil {
			return fmt.Errorf("%s: %w", t.File, err)
		}
		out, err := Render(stub, programs)
		if err != nil {
			return fmt.Errorf("%s: %w", t.File, err)
		}
		if err := os.WriteFile(file, out, 0o644); err != nil {
			return err
		}
		fmt.Fprintf(log, "seccompgen: %s: %d programs, %d KiB\n", t.File, len(programs), len(out)/1024)
	}
	return nil
}
