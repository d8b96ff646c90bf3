package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// rawCommon is what the runsc and crun targets share: both are OCI
// runtimes with the same run/exec/delete commands.
type rawCommon struct {
	tool    *tool
	prefix  string
	dir     string // this target's own temp dir
	bundle  string
	root    string
	payload string // file holding the payload, the stdin of the write
	out     string // file the read writes to

	mu   sync.Mutex
	seq  int
	live map[string]bool
}

func (r *rawCommon) create(ctx context.Context) (string, error) {
	id := r.newID()
	if err := r.tool.run(ctx, nil, nil, "run", "--detach", "--bundle", r.bundle, id); err != nil {
		return "", errors.Join(err, r.kill(context.WithoutCancel(ctx), id))
	}
	if err := r.exec(ctx, id); err != nil {
		return "", errors.Join(fmt.Errorf("first command: %w", err), r.kill(context.WithoutCancel(ctx), id))
	}
	return id, nil
}

// newID returns a fresh container ID and marks it live, so that close
// deletes it even if the command that starts it is cut short.
func (r *rawCommon) newID() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	// Fixed width: runsc matches container IDs by prefix, so b1 would
	// also name b10.
	id := fmt.Sprintf("bench-%s%06d", r.prefix, r.seq)
	if r.live == nil {
		r.live = map[string]bool{}
	}
	r.live[id] = true
	return id
}

// boot starts a container; the raw targets set no memory limit, so memMB
// is not used.
func (r *rawCommon) boot(ctx context.Context, memMB int) (string, error) {
	return r.create(ctx)
}

func (r *rawCommon) sh(ctx context.Context, id, script string) error {
	return r.tool.run(ctx, nil, nil, "exec", id, "/bin/sh", "-c", script)
}

// createIdle starts a container for the density group (raw containers
// have no timeout).
func (r *rawCommon) createIdle(ctx context.Context) (string, error) { return r.create(ctx) }

// release deletes a container; one already gone is fine.
func (r *rawCommon) release(ctx context.Context, id string) error {
	if err := r.kill(ctx, id); err != nil && !r.gone(ctx, id) {
		return err
	}
	return nil
}

// pids returns the container's init process (`state`) and its descendants:
// for runsc the sandbox process and its systrap stubs.
func (r *rawCommon) pids(ctx context.Context, id string) ([]int, error) {
	procs, err := readProcs()
	if err != nil {
		return nil, err
	}
	return r.pidsIn(ctx, procs, id)
}

// pidsIn is pids with the host's processes read already.
func (r *rawCommon) pidsIn(ctx context.Context, procs map[int]proc, id string) ([]int, error) {
	b, err := r.output(ctx, "state", id)
	if err != nil {
		return nil, err
	}
	var st struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("state %s: %w", id, err)
	}
	if st.Pid <= 0 {
		return nil, fmt.Errorf("state %s: no pid", id)
	}
	return descendants(procs, []int{st.Pid}), nil
}

// output runs a command that starts no container and returns its stdout
// (through a file, like every tool call).
func (r *rawCommon) output(ctx context.Context, args ...string) ([]byte, error) {
	f, err := os.CreateTemp(r.dir, "out-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := r.tool.run(ctx, nil, f, args...); err != nil {
		return nil, err
	}
	return os.ReadFile(f.Name())
}

func (r *rawCommon) exec(ctx context.Context, id string) error {
	return r.tool.run(ctx, nil, nil, "exec", id, "/bin/true")
}

func (r *rawCommon) writeRead(ctx context.Context, id string, data []byte) error {
	in, err := os.Open(r.payload)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := r.tool.run(ctx, in, nil, "exec", id, "/bin/sh", "-c", "cat > /tmp/f"); err != nil {
		return err
	}
	out, err := os.OpenFile(r.out, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := r.tool.run(ctx, nil, out, "exec", id, "/bin/cat", "/tmp/f"); err != nil {
		return err
	}
	got, err := os.ReadFile(r.out)
	if err != nil {
		return err
	}
	return checkPayload(got, data)
}

func (r *rawCommon) kill(ctx context.Context, id string) error {
	if err := r.tool.run(ctx, nil, nil, "delete", "--force", id); err != nil {
		return err
	}
	r.mu.Lock()
	delete(r.live, id)
	r.mu.Unlock()
	return nil
}

// close deletes every container this target may have left: those it knows
// of and those its private state dir lists (a create cut short by Ctrl-C
// may have started a container without us learning that it did).
func (r *rawCommon) close(ctx context.Context) error {
	ids := map[string]bool{}
	r.mu.Lock()
	for id := range r.live {
		ids[id] = true
	}
	r.mu.Unlock()
	var errs []error
	listing, err := os.CreateTemp(filepath.Dir(r.out), "list-")
	if err == nil {
		if lerr := r.tool.run(ctx, nil, listing, "list", "--quiet"); lerr != nil {
			errs = append(errs, lerr)
		}
		listing.Close()
		b, _ := os.ReadFile(listing.Name())
		for _, id := range strings.Fields(string(b)) {
			ids[id] = true
		}
		os.Remove(listing.Name())
	}
	for id := range ids {
		if err := r.kill(ctx, id); err != nil && !r.gone(ctx, id) {
			errs = append(errs, err)
		}
	}
	return errors.Join(append(errs, r.tool.close())...)
}

// gone reports whether the runtime no longer knows container id.
func (r *rawCommon) gone(ctx context.Context, id string) bool {
	return r.tool.run(ctx, nil, nil, "state", id) != nil
}
