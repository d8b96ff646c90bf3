package sandbox

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/errdefs"
)

// records is what is persisted of each sandbox: its directory under the
// manager's (record, bundle, logs, layer), its record (sandbox.json) and,
// once it is lost, its tombstone (lost/<id>.json). Every write goes
// through atomicfile, so a crash leaves the old record or the new one.
// It holds no lock: a sandbox's record is written under its entry's lock,
// a tombstone once per loss.
type records struct {
	root string
	// onPersist, if set, is called with every record written, under the
	// sandbox's lock (Deps.OnPersist).
	onPersist func(Sandbox)
}

// dir is the directory of sandbox id.
func (r records) dir(id string) string { return filepath.Join(r.root, id) }

// filesDir holds what a pause without memory saved of sandbox id's files.
func (r records) filesDir(id string) string { return filepath.Join(r.dir(id), "files") }

// write writes a sandbox record atomically.
func (r records) write(sb Sandbox) error {
	b, err := json.MarshalIndent(sb, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(r.dir(sb.ID), "sandbox.json"), b, 0o600); err != nil {
		return err
	}
	if r.onPersist != nil {
		r.onPersist(sb)
	}
	return nil
}

// move applies a state transition to e and writes it. Callers hold e.mu.
func (r records) move(e *entry, to State) error {
	if !canMove(e.sb.State, to) {
		return errdefs.Conflict("sandbox %s is %s and cannot become %s", e.sb.ID, e.sb.State, to)
	}
	e.sb.State = to
	return r.write(e.sb)
}

// read reads the record of sandbox id.
func (r records) read(id string) (Sandbox, error) {
	b, err := os.ReadFile(filepath.Join(r.dir(id), "sandbox.json"))
	if err != nil {
		return Sandbox{}, err
	}
	var sb Sandbox
	if err := json.Unmarshal(b, &sb); err != nil {
		return Sandbox{}, err
	}
	if sb.ID != id {
		return Sandbox{}, fmt.Errorf("record names sandbox %q", sb.ID)
	}
	return sb, nil
}

// saveTombstone keeps on disk why a sandbox is gone.
func (r records) saveTombstone(sb Sandbox) {
	dir := filepath.Join(r.root, "lost")
	os.MkdirAll(dir, 0o700)
	if b, err := json.Marshal(sb); err == nil {
		atomicfile.WriteFile(filepath.Join(dir, sb.ID+".json"), b, 0o600)
	}
}

// tombstones reads the tombstones of the last day; older ones are
// deleted.
func (r records) tombstones() []Sandbox {
	var out []Sandbox
	dir := filepath.Join(r.root, "lost")
	entries, _ := os.ReadDir(dir)
	for _, de := range entries {
		p := filepath.Join(dir, de.Name())
		info, err := de.Info()
		if err != nil || time.Since(info.ModTime()) > 24*time.Hour {
			os.Remove(p)
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var sb Sandbox
		if json.Unmarshal(b, &sb) == nil {
			out = append(out, sb)
		}
	}
	return out
}
