package template

import (
	"fmt"
	"os"
	"path"
	"regexp"
	"strconv"
	"strings"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// Defaults are what every process in a sandbox of the template gets unless
// its own request says otherwise: an OCI image's Env, WorkingDir and User,
// or the same given to a build.
type Defaults struct {
	// Env are environment variables (the sandbox's own variables win).
	Env map[string]string `json:"env,omitempty"`
	// Workdir is the default working directory (absolute; made at build).
	Workdir string `json:"workdir,omitempty"`
	// User is the default user: a name or uid in the image's /etc/passwd
	// (an OCI "user[:group]"; the group is the user's own). The build
	// stores the resolved name. Empty: E2B's default, "user".
	User string `json:"user,omitempty"`
}

// Start is a template's start command (as E2B templates have): a build
// boots the template, starts StartCmd in the background and runs ReadyCmd
// until it exits 0; the ready snapshot then holds the running process, so
// every sandbox starts with it (a sandbox booted without that snapshot runs
// the same steps before it is handed out).
type Start struct {
	// StartCmd is a shell command (run with /bin/sh -c as the default user).
	StartCmd string `json:"startCmd,omitempty"`
	// ReadyCmd is a shell command that exits 0 once StartCmd's work is
	// ready. Empty: ready when StartCmd has run for a second without
	// failing.
	ReadyCmd string `json:"readyCmd,omitempty"`
	// ReadyTimeout bounds the wait for ReadyCmd, in seconds (0: 60).
	ReadyTimeout int `json:"readyTimeout,omitempty"`
}

// DefaultReadyTimeout is the wait for a start command when a template sets none.
const DefaultReadyTimeout = 60

var (
	envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]*$`)
	userRE   = regexp.MustCompile(`^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,63}(:[A-Za-z0-9_.][A-Za-z0-9_.-]{0,63})?$`)
)

// reservedEnv are variables agentenv sets for every sandbox; a template
// cannot replace them.
var reservedEnv = map[string]bool{"E2B_SANDBOX": true, "E2B_SANDBOX_ID": true, "E2B_TEMPLATE_ID": true, "AGENTENV_ENVD_ACCESS_TOKEN": true}

// check validates process settings from a client.
func (d Defaults) check() error {
	if len(d.Env) > 1000 {
		return errdefs.Invalid("env: %d variables; at most 1000", len(d.Env))
	}
	for k, v := range d.Env {
		if !envKeyRE.MatchString(k) || len(k) > 256 {
			return errdefs.Invalid("env: variable name %q: use letters, digits, '_', '.' or '-', not starting with a digit", k)
		}
		if reservedEnv[k] {
			return errdefs.Invalid("env: %s is set by agentenv for every sandbox; leave it out", k)
		}
		if strings.IndexByte(v, 0) >= 0 || len(v) > 128<<10 {
			return errdefs.Invalid("env: value of %s contains NUL or is longer than 128 KiB", k)
		}
	}
	if d.Workdir != "" && (!path.IsAbs(d.Workdir) || strings.IndexByte(d.Workdir, 0) >= 0 || len(d.Workdir) > 4096) {
		return errdefs.Invalid("workdir %q: give an absolute path such as /home/user/app", d.Workdir)
	}
	if d.User != "" && !userRE.MatchString(d.User) {
		return errdefs.Invalid("user %q: give a user name or uid, optionally with \":group\"", d.User)
	}
	return nil
}

func (s Start) check() error {
	for _, c := range []struct{ name, v string }{{"startCmd", s.StartCmd}, {"readyCmd", s.ReadyCmd}} {
		if strings.IndexByte(c.v, 0) >= 0 || len(c.v) > 16<<10 {
			return errdefs.Invalid("%s contains NUL or is longer than 16 KiB", c.name)
		}
	}
	if s.ReadyCmd != "" && s.StartCmd == "" {
		return errdefs.Invalid("readyCmd needs a startCmd (the ready check waits for the start command)")
	}
	if s.ReadyTimeout < 0 || s.ReadyTimeout > 3600 {
		return errdefs.Invalid("readyTimeout %d: give 1-3600 seconds (0: %d)", s.ReadyTimeout, DefaultReadyTimeout)
	}
	return nil
}

// applyDefaults makes a built rootfs fit its defaults: the user resolves
// to a name in /etc/passwd (a uid missing there gets an entry, as OCI
// runtimes accept any uid) and the working directory exists. It runs after
// prepareRootfs (which adds "user") and resolves every path inside root.
func applyDefaults(root *os.Root, d *Defaults) error {
	if d.Workdir != "" {
		d.Workdir = path.Clean(d.Workdir)
		if err := root.MkdirAll(strings.TrimPrefix(d.Workdir, "/"), 0o755); err != nil {
			return fmt.Errorf("workdir %s: %w", d.Workdir, err)
		}
	}
	if d.User == "" {
		return nil
	}
	name, err := resolveUser(root, d.User)
	if err != nil {
		return err
	}
	d.User = name
	return nil
}

// resolveUser finds spec ("user[:group]", name or uid) in /etc/passwd.
func resolveUser(root *os.Root, spec string) (string, error) {
	u, group, _ := strings.Cut(spec, ":")
	found, ok, err := LookupUser(root, u)
	if err != nil {
		return "", err
	}
	if ok {
		return found.Name, nil
	}
	uid, err := strconv.ParseUint(u, 10, 32)
	if err != nil {
		return "", errdefs.Invalid("user %q is not in the image's /etc/passwd: add it to the image or give a uid", u)
	}
	gid := uid
	if g, err := strconv.ParseUint(group, 10, 32); err == nil {
		gid = g
	}
	name := fmt.Sprintf("uid%d", uid)
	if err := ensureLine(root, "etc/passwd", name+":", fmt.Sprintf("%s:x:%d:%d::/:/bin/sh", name, uid, gid)); err != nil {
		return "", err
	}
	return name, nil
}

// checkSettings validates a request's image label and process settings.
func checkSettings(req BuildRequest) error {
	if req.Image != "" && (req.Upload == nil && req.Tree == "" || len(req.Image) > 512 || strings.ContainsFunc(req.Image, func(r rune) bool { return r < 0x20 || r == 0x7f })) {
		return errdefs.Invalid("image %q: a label of at most 512 printable characters, only with an uploaded rootfs or a prepared tree", req.Image)
	}
	if err := req.Defaults.check(); err != nil {
		return err
	}
	if err := req.Size.check(); err != nil {
		return err
	}
	if req.CodeInterpreter && (req.StartCmd != "" || req.ReadyCmd != "") {
		return errdefs.Invalid("codeInterpreter sets the start command and ready check itself: leave startCmd and readyCmd out")
	}
	return req.Start.check()
}

func withRoot(dir string, f func(*os.Root) error) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	return f(root)
}
