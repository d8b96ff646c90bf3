package cli

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/agentenv/agentenv/client"
)

// buildProgress shows a template build's progress on w: a bar redrawn in
// place when w is a terminal; anywhere else (a log file, a pipe, CI) one
// line per phase, since every redraw of a bar would be a line of the log.
type buildProgress struct {
	w     io.Writer
	name  string
	bar   *progressbar.ProgressBar // nil: not a terminal
	phase string
	began time.Time
}

// newBuildProgress shows the build of template name on w; quiet shows
// nothing (--json).
func newBuildProgress(w io.Writer, name string, quiet bool) *buildProgress {
	p := &buildProgress{w: w, name: name, began: time.Now()}
	switch {
	case quiet:
		p.w = io.Discard
	case isTerminal(w):
		p.bar = progressbar.NewOptions(100,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("building "+name),
			progressbar.OptionSetWidth(30),
			progressbar.OptionShowElapsedTimeOnFinish(),
			progressbar.OptionClearOnFinish(),
		)
	}
	return p
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// show draws one progress event: the bar moves, or a line is written when
// the phase changes.
func (p *buildProgress) show(e client.BuildProgress) {
	if p.bar != nil {
		msg := e.Message
		if len(msg) > 40 {
			msg = msg[:40]
		}
		p.bar.Describe(fmt.Sprintf("%-9s %-40s", e.Phase, msg))
		p.bar.Set(int(e.Percent))
		return
	}
	if e.Phase == p.phase {
		return
	}
	p.phase = e.Phase
	line := fmt.Sprintf("building %s: %s (%d%%, %s)", p.name, e.Phase, int(e.Percent), time.Since(p.began).Round(time.Second))
	if e.Message != "" {
		line += ": " + e.Message
	}
	fmt.Fprintln(p.w, line)
}

// finish ends the bar (a terminal's line is cleared for the result).
func (p *buildProgress) finish() {
	if p.bar != nil {
		p.bar.Finish()
	}
}
