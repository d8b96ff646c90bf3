package imagebuild

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/template"
)

// step runs (or finds cached) step n and returns its layer's key. Every
// step writes one layer: an overlayfs upper dir over the base and the
// layers before it.
func (bd *build) step(ctx context.Context, n int, st Step, parent string, forced bool) (string, error) {
	key := layerKey(bd.spec.Owner, parent, st)
	dir := bd.b.layerDir(key)
	line := fmt.Sprintf("[builder %d/%d] %s", n, len(bd.spec.Steps), describe(st))
	stepName := strconv.Itoa(n)
	if !forced {
		cached, release, ok, err := bd.b.lookup(dir)
		if err != nil {
			return "", err
		}
		if ok {
			bd.logf(stepName, "info", "CACHED %s [%s]", line, key[:12])
			bd.use(dir, cached, release)
			return key, nil
		}
	}
	bd.logf(stepName, "info", "%s", line)
	begin := time.Now()
	ns, release, err := bd.runStep(ctx, n, st, dir)
	if err != nil {
		var se *StepError
		if !errors.As(err, &se) {
			err = &StepError{Step: n, Type: st.Type, Command: command(st), Err: err}
		}
		bd.logf(stepName, "error", "%v", err)
		return "", err
	}
	bd.logf(stepName, "debug", "step %d done in %s [%s]", n, time.Since(begin).Round(time.Millisecond), key[:12])
	bd.created = append(bd.created, dir)
	bd.use(dir, ns, release)
	return key, nil
}

// use makes a finished layer, held until release, the top of the build.
func (bd *build) use(dir string, st state, release func()) {
	bd.push(func() error { release(); return nil })
	if !st.Empty {
		bd.lowers = append([]string{filepath.Join(dir, "upper")}, bd.lowers...)
	}
	bd.st = st.clone()
}

// runStep runs one step on an overlay whose upper dir becomes the layer
// at dir. On failure the layer is removed and nothing stays mounted.
func (bd *build) runStep(ctx context.Context, n int, st Step, dir string) (state, func(), error) {
	tmp, err := bd.b.newTmp("layer-")
	if err != nil {
		return state{}, nil, err
	}
	// What the step writes into its layer is charged as it grows; a
	// refusal stops the step.
	upper := filepath.Join(tmp, "upper")
	sctx, cancel := context.WithCancelCause(ctx)
	stop := bd.watchGrowth(upper, cancel)
	ns, err := bd.onOverlay(sctx, n, upper, func(merged string) (state, error) {
		return bd.apply(sctx, n, st, merged)
	})
	if refused := stop(); refused != nil {
		err = refused
	}
	cancel(nil)
	var release func()
	if err == nil {
		ns.Empty = emptyDir(filepath.Join(tmp, "upper"))
		release, err = bd.b.commit(tmp, dir, ns)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return state{}, nil, err
	}
	return ns, release, nil
}

// onOverlay mounts the build's layers with upper on top in scratch, runs
// f on the merged tree and unmounts it.
func (bd *build) onOverlay(ctx context.Context, n int, upper string, f func(merged string) (state, error)) (state, error) {
	work := filepath.Join(bd.scratch, fmt.Sprintf("work-%d", n))
	merged := filepath.Join(bd.scratch, fmt.Sprintf("root-%d", n))
	for _, d := range []string{upper, work, merged} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return state{}, err
		}
	}
	defer os.RemoveAll(work)
	if err := template.MountOverlay(bd.lowers, upper, work, merged); err != nil {
		return state{}, err
	}
	ns, err := f(merged)
	if uerr := template.Unmount(merged); uerr != nil {
		return state{}, errors.Join(err, uerr)
	}
	os.Remove(merged)
	return ns, err
}

func (bd *build) apply(ctx context.Context, n int, st Step, merged string) (state, error) {
	ns := bd.st.clone()
	if st.Type == "RUN" {
		return ns, bd.run(ctx, n, st, merged, ns)
	}
	root, err := os.OpenRoot(merged)
	if err != nil {
		return state{}, err
	}
	defer root.Close()
	switch st.Type {
	case "ENV":
		err = applyEnv(&ns, st.Args)
	case "WORKDIR":
		err = applyWorkdir(root, &ns, st.Args[0])
	case "USER":
		var u template.User
		if u, err = template.EnsureUser(root, st.Args[0]); err == nil {
			ns.User = u.Name
		}
	case "COPY":
		err = bd.copy(ctx, n, st, root, ns)
	}
	return ns, err
}

// describe is a step as its log line shows it.
func describe(st Step) string {
	return st.Type + " " + command(st)
}

// command is what a step ran, for its log line and error.
func command(st Step) string {
	switch st.Type {
	case "RUN":
		if len(st.Args) > 1 && st.Args[1] != "" {
			return st.Args[0] + " (as " + st.Args[1] + ")"
		}
		return st.Args[0]
	case "ENV":
		var kv []string
		for i := 0; i+1 < len(st.Args); i += 2 {
			kv = append(kv, st.Args[i]+"="+st.Args[i+1])
		}
		return strings.Join(kv, " ")
	}
	return strings.Join(st.Args, " ")
}

func emptyDir(dir string) bool {
	f, err := os.Open(dir)
	if err != nil {
		return false
	}
	defer f.Close()
	names, _ := f.Readdirnames(1)
	return len(names) == 0
}

var envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// applyEnv sets pairs, expanding $VAR and ${VAR} against the env so far
// (as E2B's printf of the value in a shell does).
func applyEnv(st *state, args []string) error {
	for i := 0; i+1 < len(args); i += 2 {
		k := args[i]
		if !envKeyRE.MatchString(k) {
			return errdefs.Invalid("ENV %q: a variable name is letters, digits and '_', not starting with a digit", k)
		}
		st.Env[k] = os.Expand(args[i+1], func(name string) string { return st.Env[name] })
	}
	return nil
}

// applyWorkdir joins a relative path to the current workdir, makes what is
// missing (owned by the current user) and makes it the workdir.
func applyWorkdir(root *os.Root, st *state, p string) error {
	if !path.IsAbs(p) {
		p = path.Join(cmpOr(st.Workdir, "/"), p)
	}
	p = path.Clean(p)
	u, _, err := template.LookupUser(root, st.User)
	if err != nil {
		return err
	}
	cur := ""
	for _, part := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		if part == "" {
			continue
		}
		cur = path.Join(cur, part)
		if _, err := root.Stat(cur); err == nil {
			continue
		}
		if err := root.Mkdir(cur, 0o755); err != nil {
			return fmt.Errorf("WORKDIR %s: %w", p, err)
		}
		if err := root.Lchown(cur, u.UID, u.GID); err != nil {
			return err
		}
	}
	st.Workdir = p
	return nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// lookupOwner resolves "user[:group]" (names or ids) in the tree.
func lookupOwner(root *os.Root, owner string) (uid, gid int, err error) {
	name, group, _ := strings.Cut(owner, ":")
	u, ok, err := template.LookupUser(root, name)
	if err != nil {
		return 0, 0, err
	}
	if !ok {
		id, err := strconv.Atoi(name)
		if err != nil {
			return 0, 0, errdefs.Invalid("owner %q: no user %s in the image's /etc/passwd", owner, name)
		}
		u = template.User{UID: id, GID: id}
	}
	uid, gid = u.UID, u.GID
	if group != "" {
		if g, err := strconv.Atoi(group); err == nil {
			gid = g
		} else if g, ok := lookupGroup(root, group); ok {
			gid = g
		} else {
			return 0, 0, errdefs.Invalid("owner %q: no group %s in the image's /etc/group", owner, group)
		}
	}
	return uid, gid, nil
}

func lookupGroup(root *os.Root, name string) (int, bool) {
	b, err := root.ReadFile("etc/group")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Split(line, ":"); len(f) >= 3 && f[0] == name {
			if id, err := strconv.Atoi(f[2]); err == nil {
				return id, true
			}
		}
	}
	return 0, false
}

// copy runs a COPY step: the step's archive is unpacked into scratch with
// the template package's safe extractor, then its source moves to dest
// inside the tree with Docker's COPY semantics: a file to dest (or into
// it when dest ends in '/'), a directory's contents merged into dest,
// links kept as links. Owner (default: the current user) goes to all it
// copies, mode to the files.
func (bd *build) copy(ctx context.Context, n int, st Step, root *os.Root, ns state) error {
	src, dest := st.Args[0], st.Args[1]
	owner, mode := ns.User, ""
	if len(st.Args) > 2 && st.Args[2] != "" {
		owner = st.Args[2]
	}
	if len(st.Args) > 3 {
		mode = st.Args[3]
	}
	var perm fs.FileMode
	if mode != "" {
		m, err := strconv.ParseUint(mode, 8, 32)
		if err != nil || m > 0o7777 {
			return errdefs.Invalid("COPY mode %q: give octal permissions such as 0755", mode)
		}
		perm = fs.FileMode(m & 0o777)
		if m&0o4000 != 0 {
			perm |= fs.ModeSetuid
		}
		if m&0o2000 != 0 {
			perm |= fs.ModeSetgid
		}
		if m&0o1000 != 0 {
			perm |= fs.ModeSticky
		}
	}
	uid, gid, err := lookupOwner(root, owner)
	if err != nil {
		return err
	}
	unpack := filepath.Join(bd.scratch, fmt.Sprintf("copy-%d", n))
	if err := os.Mkdir(unpack, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(unpack)
	rc, err := bd.spec.Files(st.FilesHash)
	if err != nil {
		return fmt.Errorf("COPY files %s: %w", st.FilesHash, err)
	}
	_, err = template.ExtractTarCharged(ctx, rc, unpack, bd.meter.Charge)
	rc.Close()
	if err != nil {
		return fmt.Errorf("COPY files %s: %w", st.FilesHash, err)
	}
	srcRoot, err := os.OpenRoot(unpack)
	if err != nil {
		return err
	}
	defer srcRoot.Close()
	srcRel, globbed := staticPrefix(src)
	if srcRel == "" {
		return errdefs.Invalid("COPY source %q: give a path relative to the build's context, without '..'", src)
	}
	sst, err := srcRoot.Lstat(srcRel)
	if err != nil {
		return errdefs.Invalid("COPY source %q is not in the uploaded files", src)
	}
	if !path.IsAbs(dest) {
		base := ns.Workdir
		if base == "" {
			if u, ok, _ := template.LookupUser(root, ns.User); ok && u.Home != "" {
				base = u.Home
			} else {
				base = "/"
			}
		}
		dest = path.Join(base, dest) + map[bool]string{true: "/"}[strings.HasSuffix(dest, "/")]
	}
	target := strings.TrimPrefix(path.Clean(dest), "/")
	if target == "" {
		target = "."
	}
	c := copier{src: srcRoot, dst: root, uid: uid, gid: gid, perm: perm}
	if sst.IsDir() || globbed {
		return c.tree(srcRel, target)
	}
	if strings.HasSuffix(dest, "/") {
		target = path.Join(target, path.Base(srcRel))
	}
	if err := c.mkdirs(path.Dir(target)); err != nil {
		return err
	}
	return c.entry(srcRel, target, sst)
}

// staticPrefix is src without its glob parts (the archive holds only the
// matches), cleaned; globbed tells whether there were any.
func staticPrefix(src string) (string, bool) {
	if path.IsAbs(src) || slices.Contains(strings.Split(src, "/"), "..") {
		return "", false
	}
	var keep []string
	globbed := false
	for _, part := range strings.Split(path.Clean(src), "/") {
		if strings.ContainsAny(part, "*?[{") {
			globbed = true
			break
		}
		keep = append(keep, part)
	}
	p := path.Clean(strings.Join(keep, "/"))
	if p == "" {
		p = "."
	}
	return p, globbed
}

// copier moves entries from the unpacked archive into the tree, both
// through os.Root: no link in either leads outside.
type copier struct {
	src, dst *os.Root
	uid, gid int
	perm     fs.FileMode
}

// tree merges the contents of directory from into directory to.
func (c copier) tree(from, to string) error {
	if err := c.mkdirs(to); err != nil {
		return err
	}
	return fs.WalkDir(c.src.FS(), from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == from {
			return nil
		}
		rel := strings.TrimPrefix(p, from+"/")
		if from == "." {
			rel = p
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		return c.entry(p, path.Join(to, rel), info)
	})
}

// mkdirs makes dir and its missing parents, the new ones owned by the
// copy's owner (as Docker's COPY --chown does for the directories it
// makes).
func (c copier) mkdirs(dir string) error {
	if dir == "." || dir == "" {
		return nil
	}
	cur := ""
	for _, part := range strings.Split(dir, "/") {
		cur = path.Join(cur, part)
		st, err := c.dst.Stat(cur)
		if err == nil && st.IsDir() {
			continue
		}
		if err == nil {
			return errdefs.Invalid("COPY: /%s exists and is not a directory", cur)
		}
		if err := c.dst.Mkdir(cur, 0o755); err != nil {
			return err
		}
		if err := c.dst.Lchown(cur, c.uid, c.gid); err != nil {
			return err
		}
	}
	return nil
}

// entry copies one file, directory or link from the archive to name.
func (c copier) entry(from, name string, info fs.FileInfo) error {
	old, err := c.dst.Lstat(name)
	exists := err == nil
	switch {
	case info.IsDir():
		if exists && old.IsDir() {
			return c.dst.Lchown(name, c.uid, c.gid)
		}
		if exists {
			if err := c.dst.RemoveAll(name); err != nil {
				return err
			}
		}
		if err := c.dst.Mkdir(name, info.Mode().Perm()); err != nil {
			return err
		}
	case info.Mode()&fs.ModeSymlink != 0:
		target, err := c.src.Readlink(from)
		if err != nil {
			return err
		}
		if exists {
			if err := c.dst.RemoveAll(name); err != nil {
				return err
			}
		}
		if err := c.dst.Symlink(target, name); err != nil {
			return err
		}
		return c.dst.Lchown(name, c.uid, c.gid)
	case info.Mode().IsRegular():
		if exists {
			if err := c.dst.RemoveAll(name); err != nil {
				return err
			}
		}
		if err := c.file(from, name, info.Mode()); err != nil {
			return err
		}
	default:
		return nil
	}
	if err := c.dst.Lchown(name, c.uid, c.gid); err != nil {
		return err
	}
	mode := info.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	if c.perm != 0 && info.Mode().IsRegular() {
		mode = c.perm
	}
	// After chown, which clears set-id bits.
	return c.dst.Chmod(name, mode)
}

func (c copier) file(from, name string, mode fs.FileMode) error {
	in, err := c.src.OpenFile(from, os.O_RDONLY|noFollow, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := c.dst.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|noFollow, mode.Perm())
	if err != nil {
		return err
	}
	if _, err := out.ReadFrom(in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

const noFollow = syscall.O_NOFOLLOW

// growthInterval is how often a step's layer is measured while it runs.
const growthInterval = 250 * time.Millisecond

// watchGrowth charges the growth of dir (a step's upper dir) to the
// build's meter while the step runs, and cancels the step with the
// refusal when a charge fails. stop ends the watch, charges what the
// step left, and returns the refusal, if any.
func (bd *build) watchGrowth(dir string, cancel context.CancelCauseFunc) (stop func() error) {
	done := make(chan struct{})
	var refused error
	var charged int64
	measure := func() bool {
		if grown := usageOneFS(dir) - charged; grown > 0 {
			if err := bd.meter.Charge(grown); err != nil {
				refused = err
				cancel(err)
				return false
			}
			charged += grown
		}
		return true
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(growthInterval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if !measure() {
				return
			}
		}
	})
	return func() error {
		close(done)
		wg.Wait()
		if refused == nil {
			measure()
		}
		return refused
	}
}
