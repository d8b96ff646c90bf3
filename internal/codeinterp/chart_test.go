package codeinterp

import (
	"encoding/json"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/testenv"
	"time"
)

// chartOf runs a cell that shows one matplotlib figure and returns the
// chart of its one display, failing if the figure came without a PNG or a
// chart.
func chartOf(t *testing.T, url, code string) map[string]any {
	t.Helper()
	lines := run(t, url, map[string]any{"code": code})
	if errs := ofType(lines, "error"); len(errs) > 0 {
		t.Fatalf("cell failed: %v", errs)
	}
	res := ofType(lines, "result")
	if len(res) != 1 {
		t.Fatalf("got results %v, want one display of the figure", res)
	}
	if res[0]["png"] == nil {
		t.Errorf("the figure came without its PNG: %v", keys(res[0]))
	}
	c, ok := res[0]["chart"].(map[string]any)
	if !ok {
		t.Fatalf("the figure came without a chart: result fields %v", keys(res[0]))
	}
	return c
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func needMatplotlib(t *testing.T) {
	t.Helper()
	if err := exec.Command(hostPython, "-c", "import matplotlib, numpy").Run(); err != nil {
		if testenv.Required() {
			t.Fatalf("%s has no matplotlib: make setup installs python3-matplotlib", hostPython)
		}
		t.Skipf("skipping: %s has no matplotlib and numpy (make setup installs python3-matplotlib)", hostPython)
	}
}

func field(t *testing.T, c map[string]any, name string, want any) {
	t.Helper()
	if got := c[name]; !reflect.DeepEqual(got, want) {
		t.Errorf("chart %s: got %#v, want %#v", name, got, want)
	}
}

func elements(t *testing.T, c map[string]any, n int) []map[string]any {
	t.Helper()
	els, _ := c["elements"].([]any)
	if len(els) != n {
		t.Fatalf("chart %v elements: got %d, want %d (%v)", c["type"], len(els), n, els)
	}
	out := make([]map[string]any, n)
	for i, e := range els {
		out[i], _ = e.(map[string]any)
	}
	return out
}

func column(els []map[string]any, name string) []any {
	out := make([]any, len(els))
	for i, e := range els {
		out[i] = e[name]
	}
	return out
}

// A line plot over dates: type, title, labels and their units, scales,
// ticks and each line's points with ISO dates on x.
func TestChartLine(t *testing.T) {
	needMatplotlib(t)
	hs, _ := newTestServer(t)
	c := chartOf(t, hs.URL, `
import datetime
import numpy as np
import matplotlib.pyplot as plt
dates = [datetime.date(2023, 9, 1) + datetime.timedelta(days=i) for i in range(50)]
x = np.linspace(0, 2 * np.pi, 50)
plt.figure()
plt.plot(dates, np.sin(x), label='sin')
plt.plot(dates, np.cos(x), label='cos')
plt.xlabel('Day (d)')
plt.ylabel('Amplitude [V]')
plt.title('Waves')
plt.show()
`)
	field(t, c, "type", "line")
	field(t, c, "title", "Waves")
	field(t, c, "x_label", "Day (d)")
	field(t, c, "x_unit", "d")
	field(t, c, "y_label", "Amplitude [V]")
	field(t, c, "y_unit", "V")
	field(t, c, "x_scale", "datetime")
	field(t, c, "y_scale", "linear")
	for _, k := range []string{"x_ticks", "y_ticks", "x_tick_labels", "y_tick_labels"} {
		if v, _ := c[k].([]any); len(v) == 0 {
			t.Errorf("chart %s: got %v, want ticks", k, c[k])
		}
	}
	if xt, _ := c["x_ticks"].([]any); len(xt) > 0 {
		if s, ok := xt[0].(string); !ok || !isDate(s) {
			t.Errorf("first x tick: got %#v, want an ISO date", xt[0])
		}
	}
	els := elements(t, c, 2)
	field(t, els[0], "label", "sin")
	field(t, els[1], "label", "cos")
	pts, _ := els[0]["points"].([]any)
	if len(pts) != 50 {
		t.Fatalf("sin points: got %d, want 50", len(pts))
	}
	p0, _ := pts[0].([]any)
	if len(p0) != 2 || p0[1] != 0.0 {
		t.Fatalf("first sin point: got %v, want [date, 0]", p0)
	}
	if d, _ := p0[0].(string); !strings.HasPrefix(d, "2023-09-01T00:00:00") || !isDate(d) {
		t.Errorf("first sin point's x: got %#v, want 2023-09-01T00:00:00 as an ISO date", p0[0])
	}
}

func isDate(s string) bool {
	_, err := time.Parse(time.RFC3339, s)
	return err == nil
}

// A bar chart over categories: each bar's category, value and group, in
// order; labels without units have none.
func TestChartBar(t *testing.T) {
	needMatplotlib(t)
	hs, _ := newTestServer(t)
	c := chartOf(t, hs.URL, `
import matplotlib.pyplot as plt
plt.figure()
plt.bar(['A', 'B', 'C'], [3, 1, 2], label='Sold')
plt.xlabel('Author')
plt.ylabel('Books')
plt.title('Sales')
plt.show()
`)
	field(t, c, "type", "bar")
	field(t, c, "title", "Sales")
	field(t, c, "x_label", "Author")
	field(t, c, "x_unit", nil)
	field(t, c, "y_unit", nil)
	els := elements(t, c, 3)
	field(t, map[string]any{"labels": column(els, "label")}, "labels", []any{"A", "B", "C"})
	field(t, map[string]any{"values": column(els, "value")}, "values", []any{3.0, 1.0, 2.0})
	field(t, map[string]any{"groups": column(els, "group")}, "groups", []any{"Sold", "Sold", "Sold"})
}

// A pie: each wedge's label, angle in degrees and radius.
func TestChartPie(t *testing.T) {
	needMatplotlib(t)
	hs, _ := newTestServer(t)
	c := chartOf(t, hs.URL, `
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.pie([90, 10], labels=['yes', 'no'], startangle=90)
ax.set_title('Votes')
plt.show()
`)
	field(t, c, "type", "pie")
	field(t, c, "title", "Votes")
	els := elements(t, c, 2)
	field(t, els[0], "label", "yes")
	field(t, els[0], "angle", 324.0)
	field(t, els[0], "radius", 1.0)
	field(t, els[1], "label", "no")
	field(t, els[1], "angle", 36.0)
}

// A box plot: each box's five numbers and outliers as matplotlib computed
// them, and its label.
func TestChartBoxAndWhisker(t *testing.T) {
	needMatplotlib(t)
	hs, _ := newTestServer(t)
	c := chartOf(t, hs.URL, `
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.boxplot([[85, 90, 78, 92, 88], [95, 89, 76, 91, 84, 87]], labels=['A', 'B'], patch_artist=True)
ax.set_title('Scores')
ax.set_xlabel('Class')
plt.show()
`)
	field(t, c, "type", "box_and_whisker")
	field(t, c, "title", "Scores")
	field(t, c, "x_label", "Class")
	els := elements(t, c, 2)
	field(t, map[string]any{"v": column(els, "label")}, "v", []any{"A", "B"})
	field(t, map[string]any{"v": column(els, "min")}, "v", []any{78.0, 84.0})
	field(t, map[string]any{"v": column(els, "first_quartile")}, "v", []any{85.0, 84.75})
	field(t, map[string]any{"v": column(els, "median")}, "v", []any{88.0, 88.0})
	field(t, map[string]any{"v": column(els, "third_quartile")}, "v", []any{90.0, 90.5})
	field(t, map[string]any{"v": column(els, "max")}, "v", []any{92.0, 95.0})
	field(t, map[string]any{"v": column(els, "outliers")}, "v", []any{[]any{}, []any{76.0}})
}

// A figure of two axes is a superchart of a line and a scatter chart under
// the figure's title, a NaN point null (JSON has no NaN); an axes of circles is unknown, its title kept; a
// Figure as the cell's value carries its chart too.
func TestChartSuperchartScatterUnknown(t *testing.T) {
	needMatplotlib(t)
	hs, _ := newTestServer(t)
	c := chartOf(t, hs.URL, `
import numpy as np
import matplotlib.pyplot as plt
fig, axs = plt.subplots(1, 2)
fig.suptitle('Both')
axs[0].plot(np.linspace(0, 1, 10), np.linspace(0, 1, 10))
axs[0].set_title('Line')
axs[1].scatter([1, 2, 3], [float('nan'), 2, 3], label='pts')
axs[1].set_xlabel('X')
axs[1].set_title('Dots')
plt.show()
`)
	field(t, c, "type", "superchart")
	field(t, c, "title", "Both")
	els := elements(t, c, 2)
	field(t, els[0], "type", "line")
	field(t, els[0], "title", "Line")
	field(t, els[0], "x_label", nil)
	if l := elements(t, els[0], 1); len(l[0]["points"].([]any)) != 10 {
		t.Errorf("the line's points: got %v, want 10", l[0]["points"])
	}
	field(t, els[1], "type", "scatter")
	field(t, els[1], "x_label", "X")
	s := elements(t, els[1], 1)
	field(t, s[0], "label", "pts")
	// matplotlib masks a point with a NaN whole: neither coordinate is drawn.
	field(t, s[0], "points", []any{[]any{nil, nil}, []any{2.0, 2.0}, []any{3.0, 3.0}})

	c = chartOf(t, hs.URL, `
fig, ax = plt.subplots()
ax.add_artist(plt.Circle((0, 0), 1, fill=False))
ax.set_title('Circle')
plt.show()
`)
	field(t, c, "type", "unknown")
	field(t, c, "title", "Circle")
	elements(t, c, 0)

	lines := run(t, hs.URL, map[string]any{"code": "fig, ax = plt.subplots()\nax.plot([1, 2], [3, 4])\nplt.close(fig)\nfig"})
	var main map[string]any
	for _, l := range ofType(lines, "result") {
		if l["is_main_result"] == true {
			main = l
		}
	}
	if ch, _ := main["chart"].(map[string]any); ch["type"] != "line" {
		t.Errorf("a Figure as the cell's value: got result %v, want a line chart", main)
	}
	raw, _ := json.Marshal(main["chart"])
	if !strings.Contains(string(raw), `"points":[[1,3],[2,4]]`) {
		t.Errorf("the Figure's chart: got %s, want the points [[1,3],[2,4]]", raw)
	}
}
