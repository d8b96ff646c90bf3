package api

import (
	"net/http"
	"time"

	wire "github.com/agentenv/agentenv/client/api"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/snapshot"
)

// toSnapshotJSON is a snapshot as the API shows it.
func toSnapshotJSON(sn snapshot.Snapshot) wire.Snapshot {
	names := []string{}
	if sn.Name != "" {
		names = append(names, sn.Name)
	}
	return wire.Snapshot{SnapshotID: sn.ID, Names: names, Name: sn.Name, Metadata: sn.Metadata, TemplateID: sn.Template,
		Parent: sn.Parent, SandboxID: sn.Sandbox, Runtime: sn.Runtime, SizeBytes: sn.Size, StoredBytes: sn.Stored, CreatedAt: sn.CreatedAt, InUse: sn.InUse}
}

// pauseSandbox is E2B's pause: with memory (the default) the sandbox
// freezes in place; with memory: false only its files are kept and a
// resume boots it again.
func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) {
	var req wire.PauseRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	id := r.PathValue("id")
	var err error
	if req.Memory != nil && !*req.Memory {
		fp, ok := s.backend(r).(service.FilesPauser)
		if !ok {
			writeError(w, errdefs.Invalid("pause with memory: false is not available on this server (fleet mode): pause with memory"))
			return
		}
		_, err = fp.PauseFiles(r.Context(), id)
	} else {
		_, err = s.backend(r).Pause(r.Context(), id)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) {
	var req wire.ResumeRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Memory != nil && !*req.Memory {
		// A sandbox paused without memory reboots whatever this says;
		// one paused with it cannot drop it on resume (yet).
		if sb, err := s.backend(r).Get(r.Context(), r.PathValue("id")); err == nil && sb.State == sandbox.StatePaused {
			writeError(w, errdefs.Invalid("memory: false resumes a sandbox without its memory, and sandbox %s was paused with it: resume it with its memory (leave memory out), or pause it with memory: false", sb.ID))
			return
		}
	}
	var d time.Duration
	if req.Timeout != nil {
		var err error
		if d, err = seconds(*req.Timeout, "timeout"); err != nil {
			writeError(w, err)
			return
		}
	}
	sb, err := s.backend(r).Resume(r.Context(), r.PathValue("id"), d)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.toJSON(sb, true))
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var req wire.SnapshotRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	sn, err := s.backend(r).Snapshot(r.Context(), r.PathValue("id"), sandbox.SnapshotRequest{Name: req.Name, Metadata: req.Metadata})
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, toSnapshotJSON(sn))
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	out := []wire.Snapshot{}
	name := r.URL.Query().Get("name")
	list, err := s.backend(r).ListSnapshots(r.Context(), r.URL.Query().Get("sandboxID"))
	if err != nil {
		writeError(w, err)
		return
	}
	for _, sn := range list {
		if name != "" && sn.Name != name {
			continue
		}
		out = append(out, toSnapshotJSON(sn))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	sn, err := s.backend(r).GetSnapshot(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toSnapshotJSON(sn))
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	if err := s.backend(r).DeleteSnapshot(r.Context(), r.PathValue("id")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// forkSandbox answers 201 with one entry per child, as E2B's SDK reads it:
// {sandbox} for a child that runs, {error} for one that failed.
func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) {
	var req wire.ForkRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	var d time.Duration
	if req.Timeout != nil {
		var err error
		if d, err = seconds(*req.Timeout, "timeout"); err != nil {
			writeError(w, err)
			return
		}
		if d == 0 {
			writeError(w, errdefs.Invalid("timeout 0: give a positive number of seconds"))
			return
		}
	}
	results, err := s.backend(r).Fork(r.Context(), r.PathValue("id"), count, d, req.Metadata)
	if err != nil {
		// No child at all: an error status, not a 201 full of errors.
		writeError(w, err)
		return
	}
	out := make([]wire.ForkResult, 0, len(results))
	for _, res := range results {
		if res.Err != nil {
			status, code := errdefs.HTTPStatus(res.Err)
			out = append(out, wire.ForkResult{Error: &wire.Error{Status: status, ErrorCode: code, Message: res.Err.Error()}})
			continue
		}
		sj := s.toJSON(res.Sandbox, true)
		out = append(out, wire.ForkResult{Sandbox: &sj})
	}
	writeJSON(w, http.StatusCreated, out)
}
