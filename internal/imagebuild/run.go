package imagebuild

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/netns"
	"github.com/agentenv/agentenv/internal/runtime/cgroups"
	"github.com/agentenv/agentenv/internal/runtime/runscbin"
	"github.com/agentenv/agentenv/internal/template"
)

// cgroupParent holds build sandboxes' cgroups.
const cgroupParent = "agentenv-build"

// outputFileMax is how large a RUN's output file grows before it is
// emptied (after being read).
const outputFileMax = 8 << 20

// outputTail is how much of a RUN's output a StepError keeps.
const outputTail = 4 << 10

// caps are the build process's capabilities, Docker's default set (as
// sandboxes get): apt and useradd need chown and setuid; gVisor's kernel
// enforces them, not the host's.
var caps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// process is what a RUN step runs: the command in a login shell as the
// step's user, with the build's env and workdir.
func process(root *os.Root, st Step, ns state) (*specs.Process, error) {
	name := ns.User
	if len(st.Args) > 1 && st.Args[1] != "" {
		name = st.Args[1]
	}
	u, ok, err := template.LookupUser(root, name)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errdefs.Invalid("RUN as %q: no such user in the image's /etc/passwd (add it with a USER step first)", name)
	}
	args := []string{"/bin/sh", "-c", st.Args[0]}
	if _, err := root.Stat("bin/bash"); err == nil {
		args = []string{"/bin/bash", "-l", "-c", st.Args[0]}
	}
	env := map[string]string{"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	for k, v := range ns.Env {
		env[k] = v
	}
	env["HOME"], env["USER"] = u.Home, u.Name
	list := make([]string, 0, len(env))
	for k, v := range env {
		list = append(list, k+"="+v)
	}
	cwd := ns.Workdir
	if cwd == "" {
		cwd = "/"
		if st, err := root.Stat(strings.TrimPrefix(u.Home, "/")); err == nil && st.IsDir() && u.Home != "" {
			cwd = u.Home
		}
	}
	return &specs.Process{
		User:         specs.User{UID: uint32(u.UID), GID: uint32(u.GID)},
		Args:         args,
		Env:          list,
		Cwd:          cwd,
		Capabilities: &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
		Rlimits:      []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1 << 20}},
	}, nil
}

// run runs a RUN step in a gVisor sandbox whose root is the step's
// overlay (writable, --overlay2=none: writes land in the upper dir). Its
// output goes to log line by line; its end leaves no sandbox, cgroup or
// network behind, whether it exited, failed or ctx was cancelled.
func (bd *build) run(ctx context.Context, n int, st Step, merged string, ns state) error {
	root, err := os.OpenRoot(merged)
	if err != nil {
		return err
	}
	proc, err := process(root, st, ns)
	root.Close()
	if err != nil {
		return err
	}
	dir := filepath.Join(bd.scratch, fmt.Sprintf("run-%d", n))
	runRoot := filepath.Join(bd.scratch, "runsc")
	for _, d := range []string{dir, runRoot} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	defer os.RemoveAll(dir)
	sb := &sandbox{id: "build-" + randomID(), runRoot: runRoot, dir: dir}
	defer sb.close()
	if err := bd.sandboxSpec(ctx, sb, proc, merged); err != nil {
		return err
	}
	out, err := bd.execute(ctx, n, sb)
	if ctx.Err() != nil {
		return &StepError{Step: n, Type: st.Type, Command: command(st), Output: out, Err: ctx.Err()}
	}
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("failed to run command '%s': exit status %d", st.Args[0], ee.ExitCode())
		}
		return &StepError{Step: n, Type: st.Type, Command: command(st), Output: out, Err: err}
	}
	return nil
}

// sandbox is one build sandbox: its OCI spec, runsc flags and what its
// end undoes (network, cgroups, a mount point gVisor made).
type sandbox struct {
	id, runRoot, dir string
	spec             *specs.Spec
	network          string // runsc --network
	undo             []func()
}

func (sb *sandbox) close() {
	for i := len(sb.undo) - 1; i >= 0; i-- {
		sb.undo[i]()
	}
	sb.undo = nil
}

// sandboxSpec fills sb's OCI spec: the process, the tree as a writable
// root, the network Config.Network lends (else none) and the build's
// limits.
func (bd *build) sandboxSpec(ctx context.Context, sb *sandbox, proc *specs.Process, merged string) error {
	sb.spec = &specs.Spec{
		Version:  specs.Version,
		Hostname: "e2b",
		Process:  proc,
		Root:     &specs.Root{Path: merged},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
			},
		},
	}
	spec := sb.spec
	// Without a /tmp mount gVisor puts a tmpfs over an empty /tmp, and what
	// a step writes there would not reach its layer (Docker keeps it). The
	// source is resolved on the host: only a real directory, never a link
	// an earlier step made (no sandbox runs between this check and use).
	if fi, err := os.Lstat(filepath.Join(merged, "tmp")); err == nil && fi.IsDir() {
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/tmp", Type: "bind", Source: filepath.Join(merged, "tmp"), Options: []string{"rbind", "rw"}})
	}
	sb.network = "none"
	netNS := specs.LinuxNamespace{Type: specs.NetworkNamespace}
	if bd.b.cfg.Network != nil {
		nsPath, release, err := bd.b.cfg.Network(ctx)
		if err != nil {
			return fmt.Errorf("build sandbox network: %w", err)
		}
		sb.undo = append(sb.undo, release)
		sb.network, netNS.Path = "sandbox", nsPath
		// The slot's resolver is its gateway (the slot's DNS forwarder),
		// as in every sandbox; the host's resolver is not reachable.
		resolv := filepath.Join(sb.dir, "resolv.conf")
		if err := os.WriteFile(resolv, netns.ResolvConf(), 0o644); err != nil {
			return err
		}
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: resolv, Options: []string{"rbind", "ro"}})
		sb.undo = append(sb.undo, dropMountPoint(merged, "etc/resolv.conf"))
	}
	spec.Linux.Namespaces = append(spec.Linux.Namespaces, netNS)
	// Every build sandbox has limits, whether or not the build asked
	// for any: a step runs the template author's code.
	bd.limits.apply(spec)
	spec.Linux.CgroupsPath = "/" + cgroupParent + "/" + sb.id
	id, log := sb.id, bd.b.log
	sb.undo = append(sb.undo, func() {
		if err := cgroups.Remove(cgroupParent, id); err != nil {
			log.Warn("build sandbox cgroups", "id", id, "err", err)
		}
	})
	return nil
}

// execute runs the sandbox to its end (or ctx's), streaming its output to
// the log, and returns the output's tail and how runsc exited.
func (bd *build) execute(ctx context.Context, n int, sb *sandbox) (string, error) {
	bundle := filepath.Join(sb.dir, "bundle")
	if err := os.Mkdir(bundle, 0o700); err != nil {
		return "", err
	}
	data, err := json.Marshal(sb.spec)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600); err != nil {
		return "", err
	}
	// The sandbox inherits runsc's stdio: a file, never a pipe (a pipe
	// would stay open as long as any sandbox process holds it).
	outPath := filepath.Join(sb.dir, "output")
	out, err := os.OpenFile(outPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return "", err
	}
	defer out.Close()
	in, err := os.Open(outPath)
	if err != nil {
		return "", err
	}
	defer in.Close()
	args := []string{"--root", sb.runRoot, "--shared-root", runscbin.SharedRoot, "--platform", "systrap",
		"--network", sb.network, "--overlay2=none", "--allow-suid", "run", "--bundle", bundle, sb.id}
	cmd := exec.Command(bd.b.cfg.Runsc, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Dir = sb.dir
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("runsc: %w", err)
	}
	// Runs before sb.close (network, cgroups), after the wait below.
	defer destroySandbox(bd.b.cfg.Runsc, sb.runRoot, sb.id)
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	tail := &lineTail{emit: func(line string) {
		bd.log(LogEntry{Time: time.Now(), Level: "info", Step: strconv.Itoa(n), Message: line})
	}}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	done := ctx.Done()
	for {
		select {
		case err := <-waited:
			tail.read(in)
			tail.flush()
			return tail.String(), err
		case <-done:
			// Killing the sandbox ends runsc run; its exit ends the loop.
			destroySandbox(bd.b.cfg.Runsc, sb.runRoot, sb.id)
			done = nil
		case <-tick.C:
			tail.read(in)
			// The output file is only a conduit (the log and the tail keep
			// what counts): past outputFileMax it starts again, so a step
			// printing without end cannot fill the disk. Output written
			// between the read and the truncation is lost, which only a
			// step printing megabytes a tick can notice.
			if pos, err := in.Seek(0, io.SeekCurrent); err == nil && pos > outputFileMax {
				out.Truncate(0)
				in.Seek(0, io.SeekStart)
			}
		}
	}
}

// destroySandbox kills a build sandbox and deletes its state; errors are
// those of a sandbox already gone.
func destroySandbox(runsc, runRoot, id string) {
	base := []string{"--root", runRoot, "--shared-root", runscbin.SharedRoot}
	exec.Command(runsc, append(base, "kill", "--all", id, "KILL")...).Run()
	exec.Command(runsc, append(base, "delete", "--force", id)...).Run()
}

// lineTail turns output read from a file into lines and keeps the last
// outputTail bytes.
type lineTail struct {
	emit    func(string)
	partial []byte
	last    []byte
	buf     [32 << 10]byte
}

func (t *lineTail) read(r io.Reader) {
	for {
		n, err := r.Read(t.buf[:])
		if n > 0 {
			t.add(t.buf[:n])
		}
		if n == 0 || err != nil {
			return
		}
	}
}

func (t *lineTail) add(p []byte) {
	t.last = append(t.last, p...)
	if len(t.last) > 2*outputTail {
		t.last = append([]byte(nil), t.last[len(t.last)-outputTail:]...)
	}
	t.partial = append(t.partial, p...)
	for {
		i := bytes.IndexByte(t.partial, '\n')
		if i < 0 {
			break
		}
		t.emit(strings.TrimRight(string(t.partial[:i]), "\r"))
		t.partial = t.partial[i+1:]
	}
	if len(t.partial) > 64<<10 {
		t.flush()
	}
}

func (t *lineTail) flush() {
	if len(t.partial) > 0 {
		t.emit(string(t.partial))
		t.partial = nil
	}
}

func (t *lineTail) String() string {
	b := t.last
	if len(b) > outputTail {
		b = b[len(b)-outputTail:]
	}
	return strings.TrimRight(string(b), "\n")
}

// dropMountPoint returns a func that removes name from the tree if it was
// not there before: the empty file gVisor made to mount over, which must
// not stay in the layer.
func dropMountPoint(tree, name string) func() {
	root, err := os.OpenRoot(tree)
	if err != nil {
		return func() {}
	}
	if _, err := root.Lstat(name); !errors.Is(err, os.ErrNotExist) {
		root.Close()
		return func() {}
	}
	return func() {
		defer root.Close()
		if fi, err := root.Lstat(name); err == nil && fi.Mode().IsRegular() && fi.Size() == 0 {
			root.Remove(name)
		}
	}
}
