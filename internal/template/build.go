package template

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/agentenv/agentenv/internal/atomicfile"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/agentenv/agentenv/internal/envdapi"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/netns"
)

// Build builds (or rebuilds) a template and reports progress as it goes. A
// failed build leaves nothing behind and keeps an earlier template of the
// same name intact.
func (s *Store) Build(ctx context.Context, req BuildRequest, progress func(Progress)) (Template, error) {
	if err := ValidName(req.Name); err != nil {
		return Template{}, err
	}
	if err := s.checkDiskMB(req.DiskMB); err != nil {
		return Template{}, err
	}
	source, err := s.checkSource(req)
	if err != nil {
		return Template{}, err
	}
	if err := s.checkCodeInterpreter(req); err != nil {
		return Template{}, err
	}
	if req.CodeInterpreter {
		req.Start = codeInterpreterStart
	}
	owner := req.Owner
	release, err := s.claim(req.Name, func() error {
		// Checked under the lock that makes the build the name's only
		// one: a name is its owner's from the first build on.
		if prev, ok := s.templates[req.Name]; ok {
			if err := prev.ChangeableBy(req.Owner); err != nil {
				return err
			}
			if req.Owner == "" {
				owner = prev.Owner // the operator's rebuild keeps it the key's
			}
		}
		if err := s.inUse(req.Name); err != nil {
			return err
		}
		return s.quotaLocked(req.Name)
	})
	if err != nil {
		return Template{}, err
	}
	defer release()
	// What the build writes is charged as it goes (quota.go); given back
	// once the template counts on its own, or its files are removed.
	acct := s.newBuildBytes(req.Name)
	defer acct.close()

	staging, err := os.MkdirTemp(s.dir, ".build-"+req.Name+"-")
	if err != nil {
		return Template{}, err
	}
	defer os.RemoveAll(staging)
	rootfs := filepath.Join(staging, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return Template{}, err
	}

	switch {
	case req.Busybox:
		progress(Progress{Phase: "rootfs", Percent: 10, Message: "busybox"})
		err = buildBusybox(rootfs)
	case req.Debian != "":
		// debootstrap writes what it writes: its tree is measured as it
		// grows, and the run stopped when a charge is refused.
		dctx, cancel := context.WithCancelCause(ctx)
		stop := acct.watch(rootfs, 2*time.Second, cancel)
		err = s.debootstrap(dctx, req, rootfs, progress)
		if werr := stop(); werr != nil {
			err = werr
		}
		cancel(nil)
	case req.Tree != "":
		progress(Progress{Phase: "rootfs", Percent: 10, Message: "taking the prepared tree"})
		err = s.takeTree(req.Tree, rootfs, acct)
	case req.Upload != nil:
		progress(Progress{Phase: "rootfs", Percent: 10, Message: "unpacking the uploaded rootfs"})
		err = s.extract(ctx, req.Upload, rootfs, progress, acct)
	default:
		progress(Progress{Phase: "rootfs", Percent: 10, Message: "importing " + req.Rootfs})
		err = s.importRootfs(ctx, req.Rootfs, rootfs, progress, acct)
	}
	if err != nil {
		return Template{}, err
	}
	// The tree as written, with envd, before the image about doubles it.
	if err := acct.chargeTo(imageFactor * (DiskUsage(rootfs) + fileSize(s.envd))); err != nil {
		return Template{}, err
	}
	t := Template{Name: req.Name, Source: source, Packages: req.Packages, CreatedAt: time.Now().UTC(), Lowers: req.Lowers,
		Defaults: req.Defaults, Start: req.Start, DiskMB: req.DiskMB, Owner: owner, Size: req.Size}
	if req.CodeInterpreter {
		progress(Progress{Phase: "configure", Percent: 84, Message: "installing the code interpreter"})
		if err := withRoot(rootfs, func(root *os.Root) error {
			return copyInto(root, s.opts.CodeInterpreter, strings.TrimPrefix(CodeInterpreterPath, "/"), 0o755)
		}); err != nil {
			return Template{}, fmt.Errorf("install the code interpreter: %w", err)
		}
	}
	if err := s.finish(ctx, req.Name, staging, &t, progress); err != nil {
		return Template{}, err
	}
	// finish linked the new image by its ID (images.go): a build that
	// fails from here leaves that link to the sweep.
	done := false
	defer func() {
		if !done {
			s.SweepRetired()
		}
	}()
	size := DiskUsage(staging)

	final := filepath.Join(s.dir, req.Name)
	// The previous build moves aside under a name no template can have
	// (names never start with '.'), so no other template is touched.
	old, err := os.MkdirTemp(s.dir, ".old-"+req.Name+"-")
	if err != nil {
		return Template{}, err
	}
	defer os.RemoveAll(old)
	prev := filepath.Join(old, "t")
	s.mu.Lock()
	_, rebuilt := s.templates[req.Name]
	s.mu.Unlock()
	if err := os.Rename(final, prev); err != nil && !errors.Is(err, os.ErrNotExist) {
		return Template{}, err
	}
	if err := os.Rename(staging, final); err != nil {
		os.Rename(prev, final)
		return Template{}, err
	}
	s.mu.Lock()
	stored := t
	s.templates[t.Name] = &stored
	s.bytes[t.Name] = size
	t = s.copyLocked(&stored)
	s.mu.Unlock()
	done = true
	if rebuilt {
		// The image left, unless a snapshot needs it; and others kept
		// for snapshots deleted since.
		s.SweepRetired()
	}
	progress(Progress{Phase: "done", Percent: 100, Message: fmt.Sprintf("image %d MiB", t.ImageSize>>20)})
	return t, nil
}

func (s *Store) checkSource(req BuildRequest) (string, error) {
	source, err := checkSource(req)
	if err != nil || req.Rootfs == "" {
		return source, err
	}
	if _, err := s.importPath(req.Rootfs); err != nil {
		return "", err
	}
	return source, nil
}

// checkSource validates what a request can be checked for without the
// store's options.
func checkSource(req BuildRequest) (string, error) {
	n := 0
	source := ""
	if req.Busybox {
		n++
		source = "busybox"
	}
	if req.Mirror != "" {
		return "", errdefs.Invalid("mirror: the Debian mirror is the server operator's choice (agentenv serve --debian-mirror URL); API clients cannot set it: leave it out")
	}
	if req.Debian != "" {
		n++
		source = "debian:" + req.Debian
		if !suiteRE.MatchString(req.Debian) {
			return "", errdefs.Invalid("debian suite %q: use a suite name such as bookworm", req.Debian)
		}
		for _, p := range req.Packages {
			if !pkgRE.MatchString(p) {
				return "", errdefs.Invalid("package name %q is not a Debian package name", p)
			}
		}
	}
	if req.Rootfs != "" {
		n++
		source = "import:" + req.Rootfs
		if strings.IndexByte(req.Rootfs, 0) >= 0 {
			return "", errdefs.Invalid("rootfs %q: invalid path", req.Rootfs)
		}
	}
	if req.Upload != nil {
		n++
		source = "upload"
		if req.Image != "" {
			source = "oci:" + req.Image
		}
	}
	if req.Tree != "" {
		n++
		source = "steps"
		if req.Image != "" {
			source = "steps:" + req.Image
		}
		if !filepath.IsAbs(req.Tree) || strings.IndexByte(req.Tree, 0) >= 0 {
			return "", fmt.Errorf("tree %q: give an absolute directory", req.Tree)
		}
	}
	if err := checkSettings(req); err != nil {
		return "", err
	}
	if n != 1 {
		return "", errdefs.Invalid("give exactly one source: --debian SUITE, --rootfs DIR|TARBALL (uploaded by the CLI), --import PATH (inside the server's --import-dir) or busybox")
	}
	if len(req.Packages) > 0 && req.Debian == "" {
		return "", errdefs.Invalid("--packages needs --debian")
	}
	return source, nil
}

// takeTree moves a tree the server prepared into rootfs. It must be on
// the store's filesystem: a rename, never a copy.
func (s *Store) takeTree(tree, rootfs string, acct *buildBytes) error {
	st, err := os.Lstat(tree)
	if err != nil {
		return fmt.Errorf("prepared tree: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("prepared tree %s is not a directory", tree)
	}
	if err := acct.chargeTo(imageFactor * DiskUsage(tree)); err != nil {
		return err
	}
	if err := os.Remove(rootfs); err != nil {
		return err
	}
	if err := os.Rename(tree, rootfs); err != nil {
		os.Mkdir(rootfs, 0o755)
		return fmt.Errorf("move the prepared tree into the template store (it must be on the store's filesystem): %w", err)
	}
	return nil
}

// importPath resolves a client-given path inside the operator's import
// directory, following symlinks, and refuses anything that ends outside.
func (s *Store) importPath(p string) (string, error) {
	if s.opts.ImportDir == "" {
		return "", errdefs.Invalid("rootfs %q: this server imports no host paths (its operator set no --import-dir); upload the rootfs instead: agentenv template build NAME --rootfs DIR|TARBALL", p)
	}
	full := p
	if !filepath.IsAbs(p) {
		full = filepath.Join(s.opts.ImportDir, p)
	}
	resolved, err := filepath.EvalSymlinks(full)
	if err != nil {
		return "", errdefs.Invalid("rootfs %q: not found in the server's import directory", p)
	}
	rel, err := filepath.Rel(s.opts.ImportDir, resolved)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") || filepath.IsAbs(rel) {
		return "", errdefs.Invalid("rootfs %q: only paths inside the server's import directory can be imported", p)
	}
	return resolved, nil
}

// rootRefused reports whether err is os.Root's refusal of a path that
// leads out of its tree (a *fs.PathError carrying no errno: os.Root has
// no exported error value for it).
func rootRefused(err error) bool {
	var pe *fs.PathError
	var errno syscall.Errno
	return errors.As(err, &pe) && !errors.As(pe.Err, &errno)
}

// finish bakes envd and the sandbox conventions into dir/rootfs and writes
// dir/image.erofs and dir/template.json.
// busyboxUUID is the fixed filesystem UUID of busybox template images.
const busyboxUUID = "5d0b0e2a-4c1e-4f57-9a61-6167656e7476"

func (s *Store) finish(ctx context.Context, name, dir string, t *Template, progress func(Progress)) error {
	rootfs := filepath.Join(dir, "rootfs")
	progress(Progress{Phase: "configure", Percent: 85, Message: "installing envd"})
	if len(t.Lowers) > 0 {
		if err := s.prepareThin(dir, t); err != nil {
			return refusedPath(err)
		}
	} else if err := s.prepare(rootfs, t); err != nil {
		return refusedPath(err)
	}
	progress(Progress{Phase: "image", Percent: 90, Message: "writing EROFS image"})
	image := filepath.Join(dir, "image.erofs")
	tmp := image + ".tmp"
	// gVisor's EROFS reader maps only plain (not tail-packed, not
	// compressed) file data: without noinline_data binaries fail to load
	// with "bad address".
	args := []string{"-E", "noinline_data"}
	if len(t.Lowers) > 0 {
		// A lower with extended attributes failed to mount in gVisor's
		// root overlay (docs/traps.md): thin layers carry none.
		args = append(args, "-x", "-1")
	}
	if t.Source == "busybox" {
		// The busybox template is built by every node of a fleet from the
		// same inputs: a fixed timestamp and UUID make the image the same
		// bytes everywhere, so its snapshots restore on any node (gVisor
		// checks the image's superblock on restore). Its files' times are
		// then all the epoch.
		args = append(args, "-T", "0", "-U", busyboxUUID)
	}
	out, err := exec.CommandContext(ctx, "mkfs.erofs", append(args, tmp, rootfs)...).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("mkfs.erofs: %w: %s (is erofs-utils installed? run make setup)", err, lastLines(string(out)))
	}
	if err := atomicfile.Rename(tmp, image); err != nil {
		return err
	}
	st, err := os.Stat(image)
	if err != nil {
		return err
	}
	t.ImageSize = st.Size()
	if t.Digest, err = fileDigest(image); err != nil {
		return err
	}
	t.ImageID = t.Digest[:16]
	if err := s.linkImage(name, dir, t.ImageID); err != nil {
		return err
	}
	if len(t.Lowers) > 0 {
		// A thin template keeps no tree: its image is about its changes'
		// size, and a new envd is installed on the tree read back from it.
		if err := os.RemoveAll(rootfs); err != nil {
			return err
		}
	}
	t.EnvdHash = s.envdHash
	b, _ := json.MarshalIndent(t, "", "  ")
	return os.WriteFile(filepath.Join(dir, "template.json"), b, 0o644)
}

// refusedPath explains os.Root's refusal of a symlink that leads out of
// the tree; other errors pass unchanged.
func refusedPath(err error) error {
	if rootRefused(err) {
		return errdefs.Invalid("rootfs: %v: the paths agentenv sets up (/home/user, /tmp, /etc/passwd, /etc/group, /etc/hosts, /bin/bash, /.agentenv) must not be symlinks leading outside the root", err)
	}
	return err
}

// prepareRootfs installs envd and what the E2B SDK expects: /bin/bash, a
// user named "user" with a home, a world-writable /tmp, a pip that installs
// (pip.go). The tree may come from a client: every path is resolved inside
// it (os.Root), so a symlink such as home/user -> /victim fails the build
// instead of reaching the host.
func prepareRootfs(rootfs, envdBin string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := copyInto(root, envdBin, strings.TrimPrefix(EnvdPath, "/"), 0o755); err != nil {
		return err
	}
	for _, d := range []string{"tmp", "proc", "dev", "sys", "etc", "root", "home/user", "bin"} {
		if err := root.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := root.Chmod("tmp", 0o777|os.ModeSticky); err != nil {
		return err
	}
	if _, err := root.Lstat("bin/bash"); errors.Is(err, os.ErrNotExist) {
		// busybox has no bash applet: a script hands bash's arguments to sh,
		// which accepts the SDK's `-l -c CMD`.
		// envd recognises it and starts sh itself (envdapi.BashShim).
		if err := root.WriteFile("bin/bash", []byte(envdapi.BashShim), 0o755); err != nil {
			return err
		}
	}
	if err := EnsureRootUser(root); err != nil {
		return err
	}
	if err := writeResolvConf(root); err != nil {
		return err
	}
	for _, l := range []struct{ file, prefix, line string }{
		{"etc/passwd", "user:", "user:x:1000:1000:user:/home/user:/bin/bash"},
		{"etc/group", "user:", "user:x:1000:"},
		{"etc/hosts", "127.0.0.1", "127.0.0.1\tlocalhost"},
	} {
		if err := ensureLine(root, l.file, l.prefix, l.line); err != nil {
			return err
		}
	}
	if err := allowPip(root); err != nil {
		return err
	}
	err = root.Chown("home/user", 1000, 1000)
	if err != nil && os.Geteuid() != 0 && errors.Is(err, fs.ErrPermission) {
		// Only root can give it away: a build by a normal user (the
		// unprivileged test tier, whose fake runtime never mounts the
		// image) keeps it its own.
		return nil
	}
	return err
}

// writeResolvConf names the sandbox's gateway as its resolver (the
// forwarder of its network slot), replacing what the tree had: the host's
// resolv.conf that debootstrap copied, or an image's link to a resolver
// that does not run in a sandbox.
func writeResolvConf(root *os.Root) error {
	if err := root.Remove("etc/resolv.conf"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("replace /etc/resolv.conf: %w", err)
	}
	return root.WriteFile("etc/resolv.conf", netns.ResolvConf(), 0o644)
}

func ensureLine(root *os.Root, name, prefix, line string) error {
	b, err := root.ReadFile(name)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, prefix) {
			return nil
		}
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		b = append(b, '\n')
	}
	b = append(b, line+"\n"...)
	return root.WriteFile(name, b, 0o644)
}

// copyInto copies the host file src to name inside root, replacing what
// is there (a symlink is replaced, not followed).
func copyInto(root *os.Root, src, name string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if _, err := writeEntry(root, name, in); err != nil {
		return err
	}
	return root.Chmod(name, mode)
}

// buildBusybox makes a tiny rootfs from the host's static busybox.
func buildBusybox(rootfs string) error {
	bb := "/bin/busybox"
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox (package busybox-static; run make setup): %w", err)
	}
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := copyInto(root, bb, "bin/busybox", 0o755); err != nil {
		return err
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" || strings.ContainsAny(applet, "/[") {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", applet)); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	for _, l := range [][2]string{{"usr/bin", "../bin"}, {"sbin", "bin"}, {"usr/sbin", "../bin"}} {
		os.MkdirAll(filepath.Join(rootfs, "usr"), 0o755)
		if err := os.Symlink(l[1], filepath.Join(rootfs, l[0])); err != nil {
			return err
		}
	}
	return nil
}

// extract unpacks an uploaded rootfs tar stream, charging what it writes
// (with its image to come) to acct.
func (s *Store) extract(ctx context.Context, r io.Reader, rootfs string, progress func(Progress), acct *buildBytes) error {
	charge := func(n int64) error { return acct.charge(imageFactor * n) }
	skipped, err := extractTar(ctx, r, rootfs, s.opts.MaxUploadBytes, charge)
	if err != nil {
		return err
	}
	if skipped > 0 {
		progress(Progress{Phase: "rootfs", Percent: 50, Message: fmt.Sprintf("skipped %d device nodes/FIFOs", skipped)})
	}
	return nil
}

// importRootfs reads a directory or tarball from the operator's import
// directory through the same extraction as an upload.
func (s *Store) importRootfs(ctx context.Context, p, rootfs string, progress func(Progress), acct *buildBytes) error {
	src, err := s.importPath(p)
	if err != nil {
		return err
	}
	r, err := OpenRootfs(ctx, src)
	if err != nil {
		return errdefs.Invalid("rootfs %q: %v", p, err)
	}
	defer r.Close()
	return s.extract(ctx, r, rootfs, progress, acct)
}

// debootstrap builds a Debian rootfs from the operator's mirror and turns
// its log lines into progress. Package scripts run as root in a chroot on
// the host, so only packages signed by the operator's keyring may be
// installed: --force-check-gpg makes a missing or bad signature fatal
// (without it, debootstrap goes on unsigned when it has no key for a suite).
func (s *Store) debootstrap(ctx context.Context, req BuildRequest, rootfs string, progress func(Progress)) error {
	if _, err := os.Stat(s.opts.DebianKeyring); err != nil {
		return fmt.Errorf("debian keyring %s: %w (install debian-archive-keyring, or set serve --debian-keyring)", s.opts.DebianKeyring, errdefs.ErrUnavailable)
	}
	args := []string{"--variant=minbase", "--force-check-gpg", "--keyring=" + s.opts.DebianKeyring,
		"--include=" + strings.Join(debianPackages(req.Packages), ",")}
	args = append(args, req.Debian, rootfs, s.opts.DebianMirror)
	cmd := exec.CommandContext(ctx, "debootstrap", args...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("debootstrap (run make setup): %w", err)
	}
	var tailLines []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		var retrieved, extracted, configured int
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			tailLines = append(tailLines, line)
			if len(tailLines) > 20 {
				tailLines = tailLines[1:]
			}
			f := strings.Fields(line)
			if len(f) < 2 || f[0] != "I:" {
				continue
			}
			// Phase weights: download 0-40, unpack 40-60, configure 60-85.
			switch f[1] {
			case "Retrieving":
				retrieved++
				progress(Progress{Phase: "download", Percent: ramp(0, 40, retrieved, 150), Message: strings.Join(f[1:], " ")})
			case "Extracting", "Unpacking":
				extracted++
				progress(Progress{Phase: "unpack", Percent: ramp(40, 60, extracted, 2*retrieved+1), Message: strings.Join(f[1:], " ")})
			case "Configuring":
				configured++
				progress(Progress{Phase: "configure", Percent: ramp(60, 85, configured, retrieved+1), Message: strings.Join(f[1:], " ")})
			}
		}
	}()
	err := cmd.Wait()
	pw.Close()
	<-done
	// Whatever debootstrap left mounted in the tree (its /proc when a
	// package's process still held it) goes before anything reads the tree.
	if uerr := unmountUnder(rootfs); uerr != nil {
		return errors.Join(err, fmt.Errorf("debootstrap left mounts in the tree: %w", uerr))
	}
	if err != nil {
		return fmt.Errorf("debootstrap %s: %w: %s", req.Debian, err, strings.Join(tailLines, "\n"))
	}
	// Leave apt caches out of the image.
	os.RemoveAll(filepath.Join(rootfs, "var/cache/apt/archives"))
	os.MkdirAll(filepath.Join(rootfs, "var/cache/apt/archives/partial"), 0o755)
	return allowSudo(rootfs)
}

// debianPackages is what a Debian template installs: the requested
// packages and sudo, which E2B's templates have (agent code runs `sudo
// apt-get install …` as user).
func debianPackages(requested []string) []string {
	if slices.Contains(requested, "sudo") {
		return requested
	}
	return append(slices.Clone(requested), "sudo")
}

// sudoersFile lets user run anything as root without a password, as in
// E2B's templates. sudo ignores files in sudoers.d that are writable by
// anyone but root, hence 0440.
const (
	sudoersFile = "etc/sudoers.d/user"
	sudoersRule = "user ALL=(ALL:ALL) NOPASSWD: ALL\n"
)

func allowSudo(rootfs string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := root.MkdirAll("etc", 0o755); err != nil {
		return err
	}
	// sudo's PAM account check fails ("is your account locked?") for a
	// user without a shadow entry; "*" means no password login. It also
	// resolves the host name (e2b in every sandbox) and complains when it
	// cannot.
	for _, l := range []struct{ file, prefix, line string }{
		{"etc/shadow", "user:", "user:*:20000:0:99999:7:::"},
		{"etc/hosts", "127.0.1.1", "127.0.1.1\te2b"},
	} {
		if err := ensureLine(root, l.file, l.prefix, l.line); err != nil {
			return err
		}
	}
	if err := root.Chmod("etc/shadow", 0o640); err != nil {
		return err
	}
	if err := root.MkdirAll(filepath.Dir(sudoersFile), 0o750); err != nil {
		return err
	}
	if err := root.WriteFile(sudoersFile, []byte(sudoersRule), 0o440); err != nil {
		return err
	}
	if err := root.Chmod(sudoersFile, 0o440); err != nil {
		return err
	}
	return root.Chown(sudoersFile, 0, 0)
}

func ramp(from, to float64, n, total int) float64 {
	if total <= 0 {
		total = 1
	}
	p := float64(n) / float64(total)
	if p > 1 {
		p = 1
	}
	return from + (to-from)*p
}

// DefaultMirror is the host's own Debian mirror, or deb.debian.org.
func DefaultMirror() string {
	for _, f := range []string{"/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			l = strings.TrimSpace(l)
			if strings.HasPrefix(l, "URIs:") {
				if u := strings.Fields(strings.TrimPrefix(l, "URIs:")); len(u) > 0 && !strings.Contains(u[0], "security") {
					return u[0]
				}
			}
			if f := strings.Fields(l); len(f) >= 3 && f[0] == "deb" && !strings.Contains(f[1], "security") {
				return f[1]
			}
		}
	}
	return "http://deb.debian.org/debian"
}

func lastLines(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 1500 {
		s = s[len(s)-1500:]
	}
	return s
}

var (
	suiteRE = regexp.MustCompile(`^[a-z][a-z0-9-]{1,30}$`)
	pkgRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9+.:=~-]{0,100}$`)
)

// Validate checks a build request without building anything.
func (s *Store) Validate(req BuildRequest) error {
	if err := ValidName(req.Name); err != nil {
		return err
	}
	if err := s.checkDiskMB(req.DiskMB); err != nil {
		return err
	}
	if _, err := s.checkSource(req); err != nil {
		return err
	}
	return s.checkCodeInterpreter(req)
}

// checkCodeInterpreter refuses a code interpreter build this server cannot
// make: it has no code interpreter binary, or the tree has no Python.
func (s *Store) checkCodeInterpreter(req BuildRequest) error {
	if !req.CodeInterpreter {
		return nil
	}
	if s.opts.CodeInterpreter == "" {
		return errdefs.Invalid("codeInterpreter: this server has no code interpreter binary (codeinterp next to agentenv): run make build and restart it")
	}
	if req.Busybox {
		return errdefs.Invalid("codeInterpreter: busybox has no Python; build it from Debian with the packages the CLI's --code-interpreter adds")
	}
	return nil
}

// CanBuild reports, before a build starts, why it would be refused (the
// template is being built, sandboxes use it, the template quotas or the
// disk budget have no room for it), so that an API can answer with a plain
// error status instead of a failed stream.
func (s *Store) CanBuild(name string) error {
	s.mu.Lock()
	err := s.inUse(name)
	if s.building[name] {
		err = errdefs.Conflict("template %q is already being built", name)
	}
	if err == nil {
		err = s.quotaLocked(name)
	}
	s.mu.Unlock()
	if err != nil || s.opts.Reserve == nil {
		return err
	}
	// Room for the least a build writes: envd, in its tree and image.
	release, err := s.opts.Reserve(fmt.Sprintf("template %q", name), imageFactor*fileSize(s.envd))
	if err != nil {
		return err
	}
	release()
	return nil
}

// inUse refuses to replace a template sandboxes run on. Callers hold s.mu.
func (s *Store) inUse(name string) error {
	if n := s.refs.N(name); n > 0 {
		return errdefs.Conflict("template %q is used by %d sandbox(es): kill them before rebuilding it", name, n)
	}
	return nil
}

// claim marks name as being built, unless it is already or refuse (run
// under the store's lock) says no; release ends the claim.
func (s *Store) claim(name string, refuse func() error) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.building[name] {
		return nil, errdefs.Conflict("template %q is already being built", name)
	}
	if err := refuse(); err != nil {
		return nil, err
	}
	s.building[name] = true
	return func() {
		s.mu.Lock()
		delete(s.building, name)
		s.mu.Unlock()
	}, nil
}
