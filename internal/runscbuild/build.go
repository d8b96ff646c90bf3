// Package runscbuild makes agentenv's runsc build: the pinned gVisor module,
// copied, patched with patches/gvisor, and given the precompiled seccomp
// filters (rendered by seccompgen) that a `go install`ed runsc lacks, built
// static like `go install` would. It only builds binaries; it must not
// install them or run sandboxes (scripts/setup.sh checks and installs).
package runscbuild

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/agentenv/agentenv/internal/atomicfile"
)

// Module is the Go module runsc is built from.
const Module = "gvisor.dev/gvisor"

// Options say what to build.
type Options struct {
	Version string   // version of Module, RUNSC_VERSION
	Patches []string // applied in order, `patch -p1` at the module's root
	// Stub keeps the module's stub filters: runsc compiles its seccomp
	// filters at every start, as a `go install`ed one does. For comparisons.
	Stub bool
	// Work is a scratch directory owned by the build. Keep it at one path:
	// compiled packages are cached by source path, so a second build there
	// recompiles only what changed.
	Work string
	Out  string    // where the runsc binary goes (replaced by a rename)
	Log  io.Writer // progress lines and the go tool's output
	// Repo is the agentenv checkout whose seccomp generator (GeneratorDirs)
	// renders the filters.
	Repo string
}

// GeneratorDirs are the packages of agentenv's seccomp generator, relative
// to the repository. The build runs them inside the module copy.
var GeneratorDirs = []string{"cmd/seccompgen", "internal/runscbuild/seccompgen"}

// PatchedTag is the build tag the generator is built with inside the
// patched module copy: its files with the tag use what only the patches
// add (the systrap stub programs), which agentenv's own gVisor lacks.
const PatchedTag = "agentenv_patched_gvisor"

// Build builds runsc as a `go install gvisor.dev/gvisor/runsc@<version>`
// with CGO_ENABLED=0 does, but from a copy of the module that has the
// patches and (unless Stub) the precompiled seccomp filters in it.
//
// The copy is served to the go tool as that same module version by a file
// proxy, with a module cache of its own, so the binary's build information
// names the pinned version (agentenv checks it against its own) while its
// module sum is the copy's, and the host's module cache stays genuine.
func Build(ctx context.Context, opt Options) error {
	if opt.Log == nil {
		opt.Log = io.Discard
	}
	b := &build{Options: opt, src: filepath.Join(opt.Work, "src"), gen: filepath.Join(opt.Work, "gen"),
		proxy: filepath.Join(opt.Work, "proxy"), modcache: filepath.Join(opt.Work, "modcache"), bin: filepath.Join(opt.Work, "bin")}
	steps := []struct {
		name string
		run  func(context.Context) error
	}{
		{"download the module", b.download},
		{"copy the module", b.copy},
		{"apply patches", b.patch},
		{"render precompiled seccomp filters", b.render},
		{"write the module proxy", b.writeProxy},
		{"go install runsc", b.install},
	}
	for _, s := range steps {
		if err := s.run(ctx); err != nil {
			return fmt.Errorf("runsc build: %s: %w", s.name, err)
		}
	}
	return nil
}

type build struct {
	Options
	src, gen, proxy, modcache, bin string
	orig                           downloaded
}

// downloaded is what `go mod download -json` says about a module version.
type downloaded struct {
	Dir, Info, GoMod, Error string
}

func (b *build) logf(format string, args ...any) {
	fmt.Fprintf(b.Log, "runscbuild: "+format+"\n", args...)
}

func (b *build) download(ctx context.Context) error {
	if err := os.MkdirAll(b.Work, 0o755); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", Module+"@"+b.Version)
	cmd.Dir = b.Work // outside any module: nothing's go.sum changes
	cmd.Stderr = b.Log
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("%s: %w", strings.Join(cmd.Args, " "), err)
	}
	if err := json.Unmarshal(out, &b.orig); err != nil {
		return fmt.Errorf("go mod download -json: %w", err)
	}
	if b.orig.Error != "" {
		return errors.New(b.orig.Error)
	}
	return nil
}

// copy makes a writable copy of the module at src, replacing any earlier
// one (the module cache's files are read-only).
func (b *build) copy(context.Context) error {
	if err := os.RemoveAll(b.src); err != nil {
		return err
	}
	return filepath.WalkDir(b.orig.Dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(b.orig.Dir, path)
		if err != nil {
			return err
		}
		dst := filepath.Join(b.src, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file", path)
		}
		return copyFile(path, dst)
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func (b *build) patch(ctx context.Context) error {
	for _, p := range b.Patches {
		abs, err := filepath.Abs(p)
		if err != nil {
			return err
		}
		b.logf("applying %s", p)
		cmd := exec.CommandContext(ctx, "patch", "-p1", "--batch", "--forward", "--no-backup-if-mismatch", "-d", b.src, "-i", abs)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w\n%s", p, err, out)
		}
	}
	return nil
}

// render runs the seccomp generator against the module copy: in a Go
// workspace of the copy and a module holding only the generator's packages
// (named agentenv, so their imports resolve), it links the patched gVisor
// with gVisor's own dependency versions, as runsc itself does.
func (b *build) render(ctx context.Context) error {
	if b.Stub {
		return nil
	}
	if err := os.RemoveAll(b.gen); err != nil {
		return err
	}
	for _, dir := range GeneratorDirs {
		files, err := filepath.Glob(filepath.Join(b.Repo, filepath.FromSlash(dir), "*.go"))
		if err != nil {
			return err
		}
		if len(files) == 0 {
			return fmt.Errorf("no Go files in %s: is -repo the agentenv checkout?", filepath.Join(b.Repo, dir))
		}
		if err := os.MkdirAll(filepath.Join(b.gen, filepath.FromSlash(dir)), 0o755); err != nil {
			return err
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			if err := copyFile(f, filepath.Join(b.gen, filepath.FromSlash(dir), filepath.Base(f))); err != nil {
				return err
			}
		}
	}
	goVersion, err := goEnv(ctx, "GOVERSION")
	if err != nil {
		return err
	}
	goVersion = strings.TrimPrefix(goVersion, "go")
	// The copied generator imports its packages by this project's module
	// path, so the temporary module is named as the project is.
	gomod := fmt.Sprintf("module %s\n\ngo 1.26\n\nrequire %s %s\n", projectModule, Module, b.Version)
	gowork := fmt.Sprintf("go %s\n\nuse (\n\t./gen\n\t./src\n)\n", goVersion)
	if err := os.WriteFile(filepath.Join(b.gen, "go.mod"), []byte(gomod), 0o644); err != nil {
		return err
	}
	work := filepath.Join(b.Work, "go.work")
	if err := os.WriteFile(work, []byte(gowork), 0o644); err != nil {
		return err
	}
	defer os.Remove(work) // the install below is not a workspace build
	// Built as runsc is (CGO_ENABLED=0): build tags choose some rules.
	cmd := exec.CommandContext(ctx, "go", "run", "-tags", PatchedTag, "./gen/cmd/seccompgen", "-src", b.src)
	cmd.Dir = b.Work
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK="+work, "GOFLAGS=")
	cmd.Stdout, cmd.Stderr = b.Log, b.Log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w", strings.Join(cmd.Args, " "), err)
	}
	return nil
}

// projectModule is agentenv's module path (go.mod).
const projectModule = "github.com/agentenv/agentenv"

func (b *build) writeProxy(context.Context) error {
	info, err := os.ReadFile(b.orig.Info)
	if err != nil {
		return err
	}
	sum, err := WriteProxy(b.proxy, Module, b.Version, info, b.src)
	if err != nil {
		return err
	}
	b.logf("module copy %s@%s %s", Module, b.Version, sum)
	return nil
}

func (b *build) install(ctx context.Context) error {
	// Only the build's own module cache is replaced: the file proxies stay
	// valid, and the packages compiled from it are cached by path.
	if err := removeModcache(b.modcache); err != nil {
		return err
	}
	defer removeModcache(b.modcache)
	if err := os.RemoveAll(b.bin); err != nil {
		return err
	}
	hostCache, err := goEnv(ctx, "GOMODCACHE")
	if err != nil {
		return err
	}
	upstream, err := goEnv(ctx, "GOPROXY")
	if err != nil {
		return err
	}
	nosumdb, err := goEnv(ctx, "GONOSUMDB")
	if err != nil {
		return err
	}
	// The copy is not the version the checksum database knows; the module's
	// dependencies are still checked against its go.sum.
	nosumdb = strings.TrimPrefix(nosumdb+","+Module, ",")
	proxies := []string{"file://" + b.proxy, "file://" + filepath.Join(hostCache, "cache", "download")}
	if upstream != "" && upstream != "off" {
		proxies = append(proxies, upstream)
	}
	cmd := exec.CommandContext(ctx, "go", "install", Module+"/runsc@"+b.Version)
	cmd.Dir = b.Work
	// goindex=0: the go tool indexes a module-cache module once per path
	// and version, trusting it never changes, so a file a new patch adds
	// would not be compiled (its package's file list comes from the index).
	cmd.Env = append(os.Environ(),
		"CGO_ENABLED=0", "GOBIN="+b.bin, "GOMODCACHE="+b.modcache, "GOFLAGS=-modcacherw",
		"GOPROXY="+strings.Join(proxies, ","), "GONOSUMDB="+nosumdb, "GODEBUG=goindex=0")
	cmd.Stdout, cmd.Stderr = b.Log, b.Log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w", strings.Join(cmd.Args, " "), err)
	}
	if err := os.MkdirAll(filepath.Dir(b.Out), 0o755); err != nil {
		return err
	}
	built := filepath.Join(b.bin, "runsc")
	if err := atomicfile.Rename(built, b.Out); err == nil {
		return nil
	}
	// Another filesystem: copied.
	in, err := os.Open(built)
	if err != nil {
		return err
	}
	defer in.Close()
	return atomicfile.Write(b.Out, 0o755, func(w io.Writer) error {
		_, err := io.Copy(w, in)
		return err
	})
}

func removeModcache(dir string) error {
	// -modcacherw keeps it writable, so a plain removal works.
	return os.RemoveAll(dir)
}

func goEnv(ctx context.Context, name string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", name).Output()
	if err != nil {
		return "", fmt.Errorf("go env %s: %w", name, err)
	}
	return string(bytes.TrimSpace(out)), nil
}
