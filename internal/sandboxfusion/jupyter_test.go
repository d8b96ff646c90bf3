package sandboxfusion

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/testenv"
)

// runDriver runs the /run_jupyter driver on the host's Debian python3
// (with python3-matplotlib) over cells, as RunJupyter lays it out in the
// sandbox: the driver and its backend in one directory, the cwd another.
func runDriver(t *testing.T, cells []string) []CellResult {
	t.Helper()
	const py = "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import matplotlib").Run(); err != nil {
		if testenv.Required() {
			t.Fatalf("%s has no matplotlib: make setup installs python3-matplotlib", py)
		}
		t.Skipf("skipping: %s has no matplotlib (make setup installs python3-matplotlib)", py)
	}
	dir, cwd := t.TempDir(), t.TempDir()
	in, _ := json.Marshal(map[string]any{"cells": cells, "cell_timeout": 0})
	for name, b := range map[string][]byte{"jupyter_driver.py": jupyterDriver, "sandboxfusion_inline.py": jupyterBackend, "cells.json": in} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(cwd, "helper.py"), []byte("X = 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, filepath.Join(dir, "jupyter_driver.py"), filepath.Join(dir, "cells.json"), filepath.Join(dir, "out.json"))
	cmd.Dir = cwd
	cmd.Env = append(os.Environ(), "HOME="+cwd, "MPLCONFIGDIR="+filepath.Join(cwd, ".mpl"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("driver: %v: %s", err, out)
	}
	var out struct{ Cells []CellResult }
	b, err := os.ReadFile(filepath.Join(dir, "out.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if len(out.Cells) != len(cells) {
		t.Fatalf("got %d cells, want %d", len(out.Cells), len(cells))
	}
	return out.Cells
}

func isPNG(t *testing.T, v any) bool {
	t.Helper()
	s, _ := v.(string)
	b, err := base64.StdEncoding.DecodeString(s)
	return err == nil && len(b) > 8 && string(b[1:4]) == "PNG"
}

// Displays are Jupyter's data bundles: a figure shown or left open is a
// display with its PNG (once), an object's _repr_html_ is its text/html
// beside text/plain, display() adds one per object, and the files of the
// call import from the cwd.
func TestJupyterDriverDisplays(t *testing.T) {
	cells := runDriver(t, []string{
		"import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()",
		"class H:\n    def _repr_html_(self):\n        return '<b>h</b>'\nH()",
		"display(1, H())",
		"fig, ax = plt.subplots()\nax.plot([1])\nfig",
		"plt.plot([2]);",
		"import helper\nhelper.X",
		"plt.get_fignums()",
	})
	d := cells[0].Display
	if len(d) != 1 || !isPNG(t, d[0]["image/png"]) || !strings.HasPrefix(d[0]["text/plain"].(string), "<Figure size") {
		t.Errorf("plt.show(): displays %v, want one figure with its PNG", keys(d))
	}
	d = cells[1].Display
	if len(d) != 1 || d[0]["text/html"] != "<b>h</b>" || d[0]["text/plain"] == nil {
		t.Errorf("an object with _repr_html_: displays %v, want text/html <b>h</b> and text/plain", d)
	}
	d = cells[2].Display
	if len(d) != 2 || d[0]["text/plain"] != "1" || d[1]["text/html"] != "<b>h</b>" {
		t.Errorf("display(1, H()): displays %v, want two", d)
	}
	d = cells[3].Display
	if len(d) != 1 || !isPNG(t, d[0]["image/png"]) {
		t.Errorf("a Figure as the value: displays %v, want it once with its PNG", keys(d))
	}
	d = cells[4].Display
	if len(d) != 1 || !isPNG(t, d[0]["image/png"]) {
		t.Errorf("a figure left open at the cell's end: displays %v, want it shown with its PNG", keys(d))
	}
	if d := cells[5].Display; len(d) != 1 || d[0]["text/plain"] != "5" {
		t.Errorf("import of a file in the cwd: displays %v, errors %v, want 5", d, cells[5].Error)
	}
	if d := cells[6].Display; len(d) != 1 || d[0]["text/plain"] != "[]" {
		t.Errorf("figures after they were shown: %v, want none open", d)
	}
}

func keys(ds []map[string]any) [][]string {
	var out [][]string
	for _, d := range ds {
		var ks []string
		for k := range d {
			ks = append(ks, k)
		}
		out = append(out, ks)
	}
	return out
}
