package imagebuild

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/agentenv/agentenv/internal/template"
)

// baseVersion changes when what the base phase does changes, so bases
// made by an older builder are not reused.
const baseVersion = "base-1"

// base makes (or finds in the cache) the build's starting tree: an image
// pulled and flattened, an imported image's template, or a template's
// tree; then E2B's base phase: user "user" exists and is the current user.
func (bd *build) base(ctx context.Context) error {
	spec := bd.spec
	what := "FROM " + spec.FromImage
	if spec.FromTemplate != "" {
		what = "FROM template " + spec.FromTemplate
	}
	if t, ok := bd.importedTemplate(); ok || spec.FromTemplate != "" {
		if !ok {
			var err error
			if t, err = bd.b.cfg.Templates.Get(spec.FromTemplate); err != nil {
				return err
			}
		}
		bd.label = "template:" + t.Name
		if spec.FromImage != "" {
			bd.label = spec.FromImage
			what += " (imported as template " + t.Name + ")"
		}
		if bd.b.cfg.ThinLayers || len(t.Lowers) > 0 {
			return bd.stackBase(ctx, t, what)
		}
		return bd.fillBase(ctx, what, templateBase(ctx, bd, t))
	}
	bd.label = spec.FromImage
	img, err := bd.pull(ctx)
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("image %s: %w", spec.FromImage, err)
	}
	d, err := template.ImageDefaults(img)
	if err != nil {
		return fmt.Errorf("image %s: %w", spec.FromImage, err)
	}
	what += " (" + digest.String() + ")"
	bd.imageBase = bd.b.baseDir(hashKey(baseVersion, "image", digest.String()))
	return bd.fillBase(ctx, what, baseSource{
		key: hashKey(baseVersion, "image", digest.String()),
		st:  state{Env: d.Env},
		fill: func(rootfs string) error {
			r := template.FlattenImage(img)
			defer r.Close()
			if _, err := template.ExtractTarCharged(ctx, r, rootfs, bd.meter.Charge); err != nil {
				return fmt.Errorf("unpack image %s: %w", spec.FromImage, err)
			}
			return nil
		},
	})
}

// baseSource is a base made as a tree in the cache: its key, state and
// what fills its tree.
type baseSource struct {
	key  string
	st   state
	fill func(rootfs string) error
}

// templateBase copies a flat template's tree into the cache (a runtime
// that stacks no layers: its builds are flat).
func templateBase(ctx context.Context, bd *build, t template.Template) baseSource {
	src := bd.b.cfg.Templates.RootfsPath(t.Name)
	return baseSource{
		// A rebuild of the template changes its creation time or image:
		// a new base, never one pulled away under a build's mount.
		key: hashKey(baseVersion, "template", t.Name, t.CreatedAt.String(), strconv.FormatInt(t.ImageSize, 10), t.EnvdHash),
		st:  state{Env: t.Env, Workdir: t.Workdir, User: t.User},
		fill: func(rootfs string) error {
			// Held, the template cannot be rebuilt or deleted while it is
			// read.
			_, release, err := bd.b.cfg.Templates.Acquire(t.Name)
			if err != nil {
				return err
			}
			defer release()
			if err := bd.meter.Charge(template.DiskUsage(src)); err != nil {
				return err
			}
			// The host's cp copies links as links and keeps owners.
			if out, err := exec.CommandContext(ctx, "cp", "-a", "--", src+"/.", rootfs+"/").CombinedOutput(); err != nil {
				return fmt.Errorf("copy template %s: %w: %s", t.Name, err, out)
			}
			return nil
		},
	}
}

// fillBase finds base src in the cache or makes it there.
func (bd *build) fillBase(ctx context.Context, what string, src baseSource) error {
	spec := bd.spec
	key, st, fill := src.key, src.st, src.fill
	if st.Env == nil {
		st.Env = map[string]string{}
	}
	dir := bd.b.baseDir(key)
	if !spec.Force {
		cached, release, ok, err := bd.b.lookup(dir)
		if err != nil {
			return err
		}
		if ok {
			bd.logf("base", "info", "CACHED [base] %s [%s]", what, key[:12])
			bd.useBase(key, cached, release)
			return nil
		}
	}
	bd.logf("base", "info", "[base] %s", what)
	tmp, err := bd.b.newTmp("base-")
	if err != nil {
		return err
	}
	rootfs := filepath.Join(tmp, "rootfs")
	err = os.Mkdir(rootfs, 0o755)
	if err == nil {
		err = fill(rootfs)
	}
	if err == nil {
		err = basePhase(rootfs, &st)
	}
	var release func()
	if err == nil {
		release, err = bd.b.commit(tmp, dir, st)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return err
	}
	bd.created = append(bd.created, dir)
	bd.useBase(key, st, release)
	return nil
}

func (bd *build) useBase(key string, st state, release func()) {
	bd.push(func() error { release(); return nil })
	bd.baseKey = key
	bd.lowers = []string{filepath.Join(bd.b.baseDir(key), "rootfs")}
	bd.st = st.clone()
}

// importedTemplate finds a template imported from the image FromImage
// names (template build --oci or --image): used without any network. Only
// the build's owner's own import or the operator's count (the owner's
// first): an import's image is a label its uploader chose.
func (bd *build) importedTemplate() (template.Template, bool) {
	if bd.spec.FromImage == "" {
		return template.Template{}, false
	}
	var found template.Template
	ok := false
	for _, t := range bd.b.cfg.Templates.List() {
		if t.UsableByImage(bd.spec.FromImage, bd.spec.Owner) && (!ok || t.Owner != "") {
			found, ok = t, true
		}
	}
	return found, ok
}

func (bd *build) pull(ctx context.Context) (v1.Image, error) {
	r, err := bd.b.reference(bd.spec.FromImage)
	if err != nil {
		return nil, err
	}
	img, err := template.PullRef(ctx, r, bd.b.pullOptions(bd.spec.Registry)...)
	if err != nil {
		return nil, fmt.Errorf("fromImage %s: %w", bd.spec.FromImage, err)
	}
	return img, nil
}

// basePhase is what E2B's base phase does to every image: user "user"
// exists (uid 1000 when free) and is the current user; the mount points
// a sandbox needs exist, so a RUN step does not leave them in its layer.
func basePhase(rootfs string, st *state) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, d := range []string{"proc", "dev", "sys", "tmp", "etc", "home", "root"} {
		if err := root.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("base: /%s: %w", d, err)
		}
	}
	if err := root.Chmod("tmp", 0o777|os.ModeSticky); err != nil {
		return err
	}
	if err := template.EnsureRootUser(root); err != nil {
		return fmt.Errorf("base: root user: %w", err)
	}
	u, err := template.EnsureUser(root, "user")
	if err != nil {
		return fmt.Errorf("base: user: %w", err)
	}
	if st.User == "" {
		st.User = u.Name
	}
	return nil
}

// stackBase starts the build on template t's layers: its images mounted
// read-only as the overlay's lowest layers (nothing of them is copied),
// and E2B's base phase as the build's first layer. The template and its
// layers are held until the store took the finished tree (cleanup).
func (bd *build) stackBase(ctx context.Context, t template.Template, what string) error {
	digests, paths, release, err := bd.b.cfg.Templates.BuildStack(t.Name)
	if err != nil {
		return err
	}
	bd.releaseStack = release
	var mounts []string
	for i, p := range paths {
		d := filepath.Join(bd.scratch, fmt.Sprintf("lower-%d", i))
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
		if err := template.MountImage(p, d); err != nil {
			return err
		}
		bd.push(func() error { return template.Unmount(d) })
		mounts = append(mounts, d)
	}
	bd.lowers, bd.stack = mounts, digests
	st := state{Env: t.Env, Workdir: t.Workdir, User: t.User}
	if st.Env == nil {
		st.Env = map[string]string{}
	}
	bd.st = st.clone()
	// The layers' digests name their bytes: the same stack is the same
	// base, whatever the template is called now.
	key := hashKey(append([]string{baseVersion, "stack"}, digests...)...)
	dir := bd.b.layerDir(key)
	if !bd.spec.Force {
		cached, rel, ok, err := bd.b.lookup(dir)
		if err != nil {
			return err
		}
		if ok {
			bd.logf("base", "info", "CACHED [base] %s [%s]", what, key[:12])
			bd.use(dir, cached, rel)
			bd.baseKey = key
			return nil
		}
	}
	bd.logf("base", "info", "[base] %s", what)
	tmp, err := bd.b.newTmp("layer-")
	if err != nil {
		return err
	}
	upper := filepath.Join(tmp, "upper")
	ns, err := bd.onOverlay(ctx, 0, upper, func(merged string) (state, error) {
		ns := st.clone()
		return ns, basePhase(merged, &ns)
	})
	var rel func()
	if err == nil {
		ns.Empty = emptyDir(upper)
		rel, err = bd.b.commit(tmp, dir, ns)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return err
	}
	bd.created = append(bd.created, dir)
	bd.use(dir, ns, rel)
	bd.baseKey = key
	return nil
}
