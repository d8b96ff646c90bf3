// Package seccompgen renders the precompiled seccomp filter files of runsc,
// which upstream makes with a Bazel-only rule (precompiled_seccomp_rules):
// a `go install`ed runsc ships their stubs and compiles its filters at every
// sandbox start. The programs come from the gVisor packages this package is
// linked with, so it must be built against the module it renders into (the
// runsc build runs it inside the patched module copy; see runscbuild). By
// default it registers only the programs agentenv's sandboxes can use (see
// Targets for why). It imports only the standard library and gVisor, and
// writes nothing but the files it renders.
package seccompgen

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
	sentryconfig "gvisor.dev/gvisor/runsc/boot/filter/config"
	goferconfig "gvisor.dev/gvisor/runsc/fsgofer/filter/config"
)

// Target is one generated file of the gVisor module: the stub that ships in
// the module at File, to be replaced by the same file with Programs in it.
type Target struct {
	File     string // slash-separated path inside the module
	Programs func() ([]precompiledseccomp.Program, error)
	// Keep selects the programs agentenv's sandboxes can use: those whose
	// options key has every one of these fields with this value (as the
	// key prints it). Other option sets fall back to compiling at start.
	Keep map[string]string
}

// Targets are the files upstream's precompiled_seccomp_rules renders for
// runsc: the sentry's filters and the gofer's.
//
// Upstream registers every program (576 for the sentry) at the first
// lookup; that materializes ~5 MiB and cost 31 ms here (1,600 page faults
// in this VM), as much as compiling the one program needed. agentenv runs
// systrap without device proxies, from a static (no cgo) runsc, without
// host UDS: 6 sentry programs (network and directfs variants) and 4 gofer
// ones register in well under a millisecond.
var Targets = []Target{
	{File: "runsc/boot/filter/filter_precompiled.go", Programs: sentryconfig.PrecompiledPrograms,
		Keep: map[string]string{"Platform": `"systrap"`, "NVProxy": "false", "TPUProxy": "false", "RDMAProxy": "false"}},
	{File: "runsc/fsgofer/filter/filter_precompiled.go", Programs: goferconfig.PrecompiledPrograms,
		Keep: map[string]string{"CgoEnabled": "false", "UDSOpenEnabled": "false", "UDSCreateEnabled": "false"}},
}

// Select returns the programs whose option keys (their names) have every
// field of keep with its value. A key without one of the fields means the
// key format changed: that is an error, as is selecting nothing.
func Select(programs []precompiledseccomp.Program, keep map[string]string) ([]precompiledseccomp.Program, error) {
	var out []precompiledseccomp.Program
	for _, p := range programs {
		fields := ParseKey(p.Name)
		ok := true
		for k, want := range keep {
			got, found := fields[k]
			if !found {
				return nil, fmt.Errorf("program %q has no option %s: did the key format change?", p.Name, k)
			}
			ok = ok && got == want
		}
		if ok {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("none of %d programs has %v", len(programs), keep)
	}
	return out, nil
}

// ParseKey splits an options key (`GOARCH="amd64" Platform="systrap"
// NVProxyCaps= ...`, gVisor's ConfigKey) into its fields. A word without
// "=" continues the previous value.
func ParseKey(key string) map[string]string {
	fields := map[string]string{}
	last := ""
	for _, w := range strings.Fields(key) {
		if k, v, ok := strings.Cut(w, "="); ok && k != "" && !strings.ContainsAny(k, `"`) {
			fields[k], last = v, k
			continue
		}
		if last != "" {
			fields[last] += " " + w
		}
	}
	return fields
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
// place, and logs one line per file to log. With all, it registers every
// program, as upstream's rule does, instead of the Keep selection.
func Generate(root string, all bool, log io.Writer) error {
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
		total := len(programs)
		if !all {
			if programs, err = Select(programs, t.Keep); err != nil {
				return fmt.Errorf("%s: %w", t.File, err)
			}
		}
		out, err := Render(stub, programs)
		if err != nil {
			return fmt.Errorf("%s: %w", t.File, err)
		}
		if err := os.WriteFile(file, out, 0o644); err != nil {
			return err
		}
		fmt.Fprintf(log, "seccompgen: %s: %d of %d programs, %d KiB\n", t.File, len(programs), total, len(out)/1024)
	}
	return nil
}
