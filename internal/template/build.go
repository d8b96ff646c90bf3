package template

import (
	"agentenv/internal/childproc"
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"agentenv/internal/errdefs"
)

// Build builds (or rebuilds) a template and reports progress as it goes. A
// failed build leaves nothing behind and keeps an earlier template of the
// same name intact.
func (s *Store) Build(ctx context.Context, req BuildRequest, progress func(Progress)) (Template, error) {
	if err := ValidName(req.Name); err != nil {
		return Template{}, err
	}
	source, err := checkSource(req)
	if err != nil {
		return Template{}, err
	}
	s.mu.Lock()
	if s.building[req.Name] {
		s.mu.Unlock()
		return Template{}, errdefs.Conflict("template %q is already being built", req.Name)
	}
	if s.refs[req.Name] > 0 {
		s.mu.Unlock()
		return Template{}, errdefs.Conflict("template %q is used by %d sandbox(es): kill them before rebuilding it", req.Name, s.refs[req.Name])
	}
	s.building[req.Name] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.building, req.Name)
		s.mu.Unlock()
	}()

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
		err = debootstrap(ctx, req, rootfs, progress)
	default:
		progress(Progress{Phase: "rootfs", Percent: 10, Message: "copying " + req.Rootfs})
		err = copyRootfs(ctx, req.Rootfs, rootfs)
	}
	if err != nil {
		return Template{}, err
	}
	t := Template{Name: req.Name, Source: source, Packages: req.Packages, CreatedAt: time.Now().UTC()}
	if err := s.finish(ctx, req.Name, staging, &t, progress); err != nil {
		return Template{}, err
	}

	final := filepath.Join(s.dir, req.Name)
	old := final + ".old"
	os.RemoveAll(old)
	if err := os.Rename(final, old); err != nil && !errors.Is(err, os.ErrNotExist) {
		return Template{}, err
	}
	if err := os.Rename(staging, final); err != nil {
		os.Rename(old, final)
		return Template{}, err
	}
	os.RemoveAll(old)
	s.mu.Lock()
	s.templates[t.Name] = &t
	s.mu.Unlock()
	progress(Progress{Phase: "done", Percent: 100, Message: fmt.Sprintf("image %d MiB", t.ImageSize>>20)})
	return t, nil
}

func checkSource(req BuildRequest) (string, error) {
	n := 0
	source := ""
	if req.Busybox {
		n++
		source = "busybox"
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
		source = "rootfs:" + req.Rootfs
		if !filepath.IsAbs(req.Rootfs) {
			return "", errdefs.Invalid("rootfs %q: give an absolute path on the server's machine", req.Rootfs)
		}
		if _, err := os.Stat(req.Rootfs); err != nil {
			return "", errdefs.Invalid("rootfs %q: %v", req.Rootfs, err)
		}
	}
	if n != 1 {
		return "", errdefs.Invalid("give exactly one source: --debian SUITE, --rootfs PATH (directory or tarball) or busybox")
	}
	if len(req.Packages) > 0 && req.Debian == "" {
		return "", errdefs.Invalid("--packages needs --debian")
	}
	return source, nil
}

// finish bakes envd and the sandbox conventions into dir/rootfs and writes
// dir/image.erofs and dir/template.json.
func (s *Store) finish(ctx context.Context, name, dir string, t *Template, progress func(Progress)) error {
	rootfs := filepath.Join(dir, "rootfs")
	progress(Progress{Phase: "configure", Percent: 85, Message: "installing envd"})
	if err := prepareRootfs(rootfs, s.envd); err != nil {
		return fmt.Errorf("prepare rootfs: %w", err)
	}
	progress(Progress{Phase: "image", Percent: 90, Message: "writing EROFS image"})
	image := filepath.Join(dir, "image.erofs")
	tmp := image + ".tmp"
	// gVisor's EROFS reader maps only plain (not tail-packed, not
	// compressed) file data: without noinline_data binaries fail to load
	// with "bad address".
	out, err := childproc.CombinedOutput(exec.CommandContext(ctx, "mkfs.erofs", "-E", "noinline_data", tmp, rootfs))
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("mkfs.erofs: %w: %s (is erofs-utils installed? run make setup)", err, lastLines(string(out)))
	}
	if err := os.Rename(tmp, image); err != nil {
		return err
	}
	st, err := os.Stat(image)
	if err != nil {
		return err
	}
	t.ImageSize = st.Size()
	t.EnvdHash = s.envdHash
	b, _ := json.MarshalIndent(t, "", "  ")
	return os.WriteFile(filepath.Join(dir, "template.json"), b, 0o644)
}

// prepareRootfs installs envd and what the E2B SDK expects: /bin/bash, a
// user named "user" with a home, a world-writable /tmp.
func prepareRootfs(rootfs, envd string) error {
	if err := copyFile(envd, filepath.Join(rootfs, EnvdPath), 0o755); err != nil {
		return err
	}
	for _, d := range []string{"tmp", "proc", "dev", "sys", "etc", "root", "home/user", "bin"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(rootfs, "tmp"), 0o1777|os.ModeSticky); err != nil {
		return err
	}
	if _, err := os.Lstat(filepath.Join(rootfs, "bin/bash")); errors.Is(err, os.ErrNotExist) {
		// busybox has no bash applet: a script hands bash's arguments to sh,
		// which accepts the SDK's `-l -c CMD`.
		if err := os.WriteFile(filepath.Join(rootfs, "bin/bash"), []byte("#!/bin/sh\nexec /bin/sh \"$@\"\n"), 0o755); err != nil {
			return err
		}
	}
	if err := ensureLine(filepath.Join(rootfs, "etc/passwd"), "root:", "root:x:0:0:root:/root:/bin/sh"); err != nil {
		return err
	}
	if err := ensureLine(filepath.Join(rootfs, "etc/group"), "root:", "root:x:0:"); err != nil {
		return err
	}
	if err := ensureLine(filepath.Join(rootfs, "etc/passwd"), "user:", "user:x:1000:1000:user:/home/user:/bin/bash"); err != nil {
		return err
	}
	if err := ensureLine(filepath.Join(rootfs, "etc/group"), "user:", "user:x:1000:"); err != nil {
		return err
	}
	if err := os.Chown(filepath.Join(rootfs, "home/user"), 1000, 1000); err != nil {
		return err
	}
	if err := ensureLine(filepath.Join(rootfs, "etc/hosts"), "127.0.0.1", "127.0.0.1\tlocalhost"); err != nil {
		return err
	}
	return nil
}

func ensureLine(path, prefix, line string) error {
	b, err := os.ReadFile(path)
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
	return os.WriteFile(path, b, 0o644)
}

func copyFile(src, dst string, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// buildBusybox makes a tiny rootfs from the host's static busybox.
func buildBusybox(rootfs string) error {
	bb := "/bin/busybox"
	out, err := childproc.Output(exec.Command(bb, "--list"))
	if err != nil {
		return fmt.Errorf("busybox (package busybox-static; run make setup): %w", err)
	}
	if err := copyFile(bb, filepath.Join(rootfs, "bin/busybox"), 0o755); err != nil {
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

func copyRootfs(ctx context.Context, src, dst string) error {
	st, err := os.Stat(src)
	if err != nil {
		return errdefs.Invalid("rootfs %q: %v", src, err)
	}
	var cmd *exec.Cmd
	if st.IsDir() {
		cmd = exec.CommandContext(ctx, "cp", "-a", "--", src+"/.", dst)
	} else {
		cmd = exec.CommandContext(ctx, "tar", "-xf", src, "-C", dst, "--numeric-owner")
	}
	if out, err := childproc.CombinedOutput(cmd); err != nil {
		return errdefs.Invalid("unpack rootfs %q: %v: %s", src, err, lastLines(string(out)))
	}
	return nil
}

// debootstrap builds a Debian rootfs and turns its log lines into progress.
func debootstrap(ctx context.Context, req BuildRequest, rootfs string, progress func(Progress)) error {
	mirror := req.Mirror
	if mirror == "" {
		mirror = DefaultMirror()
	}
	args := []string{"--variant=minbase"}
	if len(req.Packages) > 0 {
		args = append(args, "--include="+strings.Join(req.Packages, ","))
	}
	args = append(args, req.Debian, rootfs, mirror)
	cmd := exec.CommandContext(ctx, "debootstrap", args...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := childproc.Start(cmd); err != nil {
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
	if err != nil {
		return fmt.Errorf("debootstrap %s: %w: %s", req.Debian, err, strings.Join(tailLines, "\n"))
	}
	// Leave apt caches out of the image.
	os.RemoveAll(filepath.Join(rootfs, "var/cache/apt/archives"))
	os.MkdirAll(filepath.Join(rootfs, "var/cache/apt/archives/partial"), 0o755)
	return nil
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
func Validate(req BuildRequest) error {
	if err := ValidName(req.Name); err != nil {
		return err
	}
	_, err := checkSource(req)
	return err
}

// CanBuild reports, before a build starts, why it would be refused (the
// template is being built, or sandboxes use it), so that an API can answer
// with a plain error status instead of a failed stream.
func (s *Store) CanBuild(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.building[name] {
		return errdefs.Conflict("template %q is already being built", name)
	}
	if n := s.refs[name]; n > 0 {
		return errdefs.Conflict("template %q is used by %d sandbox(es): kill them before rebuilding it", name, n)
	}
	return nil
}
