package seccompgen

import (
	"bytes"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
)

// moduleDir returns the directory of the pinned gVisor module in the
// module cache (the version agentenv links).
func moduleDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "gvisor.dev/gvisor").Output()
	if err != nil {
		t.Fatalf("go list -m gvisor.dev/gvisor: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func TestRenderStubs(t *testing.T) {
	dir := moduleDir(t)
	progs := []precompiledseccomp.Program{
		{Name: "b", Bytecode32: []uint32{0x20, 0x4}, VarOffsets: map[string][]int{"x": {1}, "y": nil}},
		{Name: "a", Bytecode32: []uint32{0x6, 0x7fff0000}, VarOffsets: map[string][]int{}},
	}
	for _, tg := range Targets {
		t.Run(tg.File, func(t *testing.T) {
			stub, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(tg.File)))
			if err != nil {
				t.Fatal(err)
			}

			// No programs: the stub with precompilation turned on.
			got, err := Render(stub, nil)
			if err != nil {
				t.Fatal(err)
			}
			want := bytes.Replace(stub, []byte(disabledLine), []byte(enabledLine), 1)
			if !bytes.Equal(got, want) {
				t.Errorf("Render(stub, nil) differs from the stub beyond the disabled flag:\n%s", got)
			}

			got, err = Render(stub, progs)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := parser.ParseFile(token.NewFileSet(), tg.File, got, parser.AllErrors); err != nil {
				t.Fatalf("rendered file does not parse: %v", err)
			}
			// Sorted by name, in registerPrograms, as upstream's generator
			// writes them (Program.Registration with a tab indent).
			regs := mapLine + "\n" + progs[1].Registration("\t", "precompiledseccomp", "programs") +
				progs[0].Registration("\t", "precompiledseccomp", "programs") + assignLine + "\n"
			if !bytes.Contains(got, []byte(regs)) {
				t.Errorf("rendered file lacks the registrations in order; got:\n%s", got)
			}
			if n := bytes.Count(got, []byte("\n")) - bytes.Count(stub, []byte("\n")); n != strings.Count(regs, "\n")-2 {
				t.Errorf("rendered file has %d more lines than the stub, want %d", n, strings.Count(regs, "\n")-2)
			}

			if _, err := Render(got, progs); err == nil {
				t.Error("Render of a rendered file succeeded, want an error")
			}
			dup := append(progs, progs[0])
			if _, err := Render(stub, dup); err == nil || !strings.Contains(err.Error(), "duplicate") {
				t.Errorf("Render with a duplicate name: err = %v, want duplicate", err)
			}
		})
	}
}
