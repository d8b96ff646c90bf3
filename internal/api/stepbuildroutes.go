package api

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	wire "github.com/agentenv/agentenv/client/api"
	"github.com/agentenv/agentenv/internal/diskmeter"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/imagebuild"
	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/template"
)

// E2B's template-in-code routes, as its SDKs call them: create a build
// (POST /v3/templates), the upload handshake of COPY steps, start the
// build with its steps, poll its status and log; aliases and tags.

func (s *Server) stepBuildRoutes(mux *http.ServeMux, auth func(string, http.HandlerFunc)) {
	auth("POST /v3/templates", s.createStepBuild)
	auth("GET /templates/{templateID}/files/{hash}", s.buildFileUpload)
	// The SDK's upload sends no API key: the URL's token authorises it.
	mux.HandleFunc("PUT /templates/{templateID}/files/{hash}", s.putBuildFile)
	auth("POST /v2/templates/{templateID}/builds/{buildID}", s.startStepBuild)
	auth("GET /templates/{templateID}/builds/{buildID}/status", s.stepBuildStatus)
	auth("GET /templates/{templateID}/builds/{buildID}/logs", s.stepBuildLogs)
	auth("GET /templates/aliases/{alias}", s.templateAlias)
	auth("POST /templates/tags", s.assignTags)
	auth("DELETE /templates/tags", s.deleteTags)
	// E2B's GET /templates/{templateID}/tags: Go's router finds that
	// pattern ambiguous with /templates/aliases/{alias}, so it takes any
	// second segment and serves only "tags".
	auth("GET /templates/{templateID}/{sub}", s.listTags)
}

// templateBuilds returns the build service, or answers that this server
// has none.
func (s *Server) templateBuilds(w http.ResponseWriter) *TemplateBuilds {
	tb := s.cfg.TemplateBuilds
	if tb == nil || tb.cfg.Steps == nil {
		writeError(w, errdefs.Unavailable("template builds from steps are not enabled on this server: `agentenv serve` runs them (not `agentenv api`, a fleet's API server); use `agentenv template build` meanwhile"))
		return nil
	}
	return tb
}

var tagRE = regexp.MustCompile(`^[a-z0-9_.-]{1,64}$`)

// parseName splits E2B's template name "alias[:tag]" (as E2B does: trimmed
// and lower-cased). The alias is the agentenv template's name.
func parseName(name string) (alias, tag string, err error) {
	name = strings.ToLower(strings.TrimSpace(name))
	if name == "" {
		return "", "", errdefs.Invalid("name is required: give the template's alias, e.g. Template.build(t, 'my-template')")
	}
	if strings.Contains(name, "/") {
		return "", "", errdefs.Invalid("template name %q has a namespace: this server has no teams, give the alias alone", name)
	}
	alias, tag, hasTag := strings.Cut(name, ":")
	if err := template.ValidName(alias); err != nil {
		return "", "", err
	}
	if hasTag {
		if err := checkTag(tag); err != nil {
			return "", "", err
		}
	}
	return alias, tag, nil
}

func checkTag(tag string) error {
	if !tagRE.MatchString(tag) {
		return errdefs.Invalid("invalid tag %q: use 1-64 lower-case letters, digits, '_', '.' or '-'", tag)
	}
	return nil
}

func (s *Server) createStepBuild(w http.ResponseWriter, r *http.Request) {
	tb := s.templateBuilds(w)
	if tb == nil {
		return
	}
	var req wire.TemplateBuildRequestV3
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	name := req.Name
	if name == "" {
		name = req.Alias
	}
	alias, tag, err := parseName(name)
	if err == nil && (req.CPUCount < 0 || req.CPUCount > 64) {
		err = errdefs.Invalid("cpuCount %d: give 1 to 64, or leave it out for the server's default", req.CPUCount)
	}
	if err == nil && req.MemoryMB != 0 && (req.MemoryMB < 128 || req.MemoryMB > 1<<20) {
		err = errdefs.Invalid("memoryMB %d: give at least 128, or leave it out for the server's default", req.MemoryMB)
	}
	var tags []string
	if tag != "" {
		tags = append(tags, tag)
	}
	for _, t := range req.Tags {
		if err == nil {
			err = checkTag(t)
		}
		if !slices.Contains(tags, t) {
			tags = append(tags, t)
		}
	}
	if err != nil {
		writeError(w, err)
		return
	}
	if len(tags) == 0 {
		tags = []string{"default"}
	}
	if err := s.mayBuild(r, tb, alias); err != nil {
		writeError(w, err)
		return
	}
	b := tb.create(identityOf(r.Context()).Name, alias, tags, req.CPUCount, req.MemoryMB)
	writeJSON(w, http.StatusAccepted, wire.TemplateRequestResponseV3{TemplateID: alias, BuildID: b.buildID,
		Names: []string{alias}, Tags: tags, Aliases: []string{alias}})
}

// mayBuild refuses the caller's build of templateID (and so uploads for
// it) when the name is another key's: a template of another owner, or
// another key's build of it running.
func (s *Server) mayBuild(r *http.Request, tb *TemplateBuilds, templateID string) error {
	id := identityOf(r.Context())
	t, err := s.backend(r).GetTemplate(r.Context(), templateID)
	switch {
	case err == nil:
		if err := t.ChangeableBy(id.Name); err != nil {
			return err
		}
	case !errors.Is(err, errdefs.ErrNotFound):
		return err
	}
	return tb.checkBuilder(id.Name, templateID)
}

// knownTemplate reports whether templateID has a build of the caller's
// here or exists, and is the caller's to build.
func (s *Server) knownTemplate(r *http.Request, tb *TemplateBuilds, templateID string) error {
	if err := template.ValidName(templateID); err != nil {
		return err
	}
	if err := s.mayBuild(r, tb, templateID); err != nil {
		return err
	}
	id := identityOf(r.Context())
	tb.mu.Lock()
	known := false
	for _, b := range tb.order {
		known = known || b.templateID == templateID && (id.all() || b.owner == id.Name)
	}
	tb.mu.Unlock()
	if known {
		return nil
	}
	_, err := s.backend(r).GetTemplate(r.Context(), templateID)
	return err
}

// buildFileUpload answers whether a COPY step's archive is stored, and
// where to PUT it: an absolute URL on this server (as the request reached
// it) with a token bound to the template and hash.
func (s *Server) buildFileUpload(w http.ResponseWriter, r *http.Request) {
	tb := s.templateBuilds(w)
	if tb == nil {
		return
	}
	tid, hash := r.PathValue("templateID"), r.PathValue("hash")
	err := checkFilesHash(hash)
	if err == nil {
		err = s.knownTemplate(r, tb, tid)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	// As the client reached us: directly, or through a proxy ending TLS.
	scheme := "http"
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		scheme = "https"
	}
	owner := identityOf(r.Context()).Name
	u := url.URL{Scheme: scheme, Host: r.Host, Path: "/templates/" + tid + "/files/" + hash,
		RawQuery: url.Values{"token": {tb.files.token(owner, tid, hash, time.Now().Add(uploadTTL))}}.Encode()}
	writeJSON(w, http.StatusCreated, wire.TemplateBuildFileUpload{Present: tb.files.present(owner, tid, hash), URL: u.String()})
}

// contentDigest reads RFC 9530's Content-Digest header for sha-256 (the
// SDKs send none; other clients may), as hex; "" when absent.
func contentDigest(r *http.Request) (string, error) {
	h := r.Header.Get("Content-Digest")
	if h == "" {
		return "", nil
	}
	for _, item := range strings.Split(h, ",") {
		alg, val, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || !strings.EqualFold(alg, "sha-256") {
			continue
		}
		b, err := base64.StdEncoding.DecodeString(strings.Trim(val, ":"))
		if err != nil || len(b) != sha256.Size {
			return "", errdefs.Invalid("Content-Digest %q: give sha-256=:BASE64 OF THE 32-BYTE DIGEST:", h)
		}
		return hex.EncodeToString(b), nil
	}
	return "", nil
}

// putBuildFile stores an uploaded archive (no API key: the URL's token,
// which says whose it is).
func (s *Server) putBuildFile(w http.ResponseWriter, r *http.Request) {
	tb := s.templateBuilds(w)
	if tb == nil {
		return
	}
	tid, hash := r.PathValue("templateID"), r.PathValue("hash")
	var owner, want string
	err := template.ValidName(tid)
	if err == nil {
		err = checkFilesHash(hash)
	}
	if err == nil {
		owner, err = tb.files.checkToken(tid, hash, r.URL.Query().Get("token"), time.Now())
	}
	if err == nil && r.ContentLength > tb.cfg.MaxUploadBytes {
		err = fmt.Errorf("the archive (%d bytes) is larger than this server's limit of %d bytes (serve --max-copy-upload-mb): copy fewer files: %w", r.ContentLength, tb.cfg.MaxUploadBytes, errdefs.ErrTooLarge)
	}
	if err == nil {
		want, err = contentDigest(r)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	// Charged as it arrives: an upload the host's disk cannot take stops
	// at the chunk that does not fit, and store removes what it wrote.
	meter := tb.cfg.Meter.Start(fmt.Sprintf("an upload of COPY files for template %q", tid))
	_, created, err := tb.files.store(owner, tid, hash, diskmeter.Reader(r.Body, meter), tb.cfg.MaxUploadBytes, want)
	meter.Close()
	io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeError(w, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, wire.TemplateBuildFileUpload{Present: true})
}

func (s *Server) startStepBuild(w http.ResponseWriter, r *http.Request) {
	tb := s.templateBuilds(w)
	if tb == nil {
		return
	}
	b, err := tb.get(identityOf(r.Context()), r.PathValue("templateID"), r.PathValue("buildID"))
	if err != nil {
		writeError(w, err)
		return
	}
	var req wire.TemplateBuildStartV2
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	// The name may have become another key's since the build was made.
	err = s.mayBuild(r, tb, b.templateID)
	var spec imagebuild.Spec
	var from string
	if err == nil {
		spec, from, err = s.buildSpec(r, tb, b, req)
	}
	if err == nil {
		err = s.notInUse(r, b.templateID)
	}
	if err == nil {
		err = tb.start(b, spec, from, s.backend(r))
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// notInUse refuses to rebuild a template sandboxes run on (the store
// would refuse it only after the steps ran).
func (s *Server) notInUse(r *http.Request, name string) error {
	t, err := s.backend(r).GetTemplate(r.Context(), name)
	if err == nil && t.InUse > 0 {
		return errdefs.Conflict("template %q is used by %d sandbox(es): kill them before rebuilding it", name, t.InUse)
	}
	return nil
}

// maxSteps bounds one build's steps.
const maxSteps = 512

// buildSpec checks a start request's shape and turns it into the
// builder's Spec; from says what the build starts from, for its log.
// What a step does is the builder's to check.
func (s *Server) buildSpec(r *http.Request, tb *TemplateBuilds, b *stepBuild, req wire.TemplateBuildStartV2) (spec imagebuild.Spec, from string, err error) {
	spec, err = s.buildSpecSteps(r, tb, b, req)
	if err != nil {
		return spec, "", err
	}
	from = "template " + spec.FromTemplate
	if spec.FromImage != "" {
		from = spec.FromImage
		if name, ok := s.templateForImage(r, tb, b.owner, spec); ok {
			from = fmt.Sprintf("%s: the template %s on this server (a template of that name is used before any pull)", spec.FromImage, name)
			spec.FromImage, spec.FromTemplate = "", name
		}
	}
	return spec, from, nil
}

// templateForImage returns the template a fromImage reference stands for
// on this server (Dockerfiles' FROM base, for a template "base"): as
// Docker uses a local image before pulling, a reference of a name alone,
// NAME or NAME:TAG (no registry host, no path, no digest), whose NAME is
// a template of the operator or of the build's owner and whose TAG is
// none, "latest", "default" or one of the template's tags. Anything else
// is pulled: python:3.12 stays Docker Hub's unless the template "python"
// has the tag 3.12. Another key's template never stands for an image:
// names are first come, first served, and one key's "python" must not
// become every key's FROM python (fromTemplate names it explicitly). A
// build with registry credentials means a registry: it is always pulled.
func (s *Server) templateForImage(r *http.Request, tb *TemplateBuilds, owner string, spec imagebuild.Spec) (string, bool) {
	ref := spec.FromImage
	if spec.Registry != nil || strings.ContainsAny(ref, "/@") {
		return "", false
	}
	name, tag, _ := strings.Cut(ref, ":")
	if template.ValidName(name) != nil {
		return "", false
	}
	t, err := s.backend(r).GetTemplate(r.Context(), name)
	if err != nil || t.Owner != "" && t.Owner != owner {
		return "", false
	}
	switch tag {
	case "", "latest", "default":
		return name, true
	}
	_, tagged := tb.files.tagged(name, tag)
	return name, tagged
}

// buildSpecSteps checks the request's shape and its steps.
func (s *Server) buildSpecSteps(r *http.Request, tb *TemplateBuilds, b *stepBuild, req wire.TemplateBuildStartV2) (imagebuild.Spec, error) {
	spec := imagebuild.Spec{Name: b.templateID, Owner: b.owner, FromImage: strings.TrimSpace(req.FromImage), Force: req.Force,
		StartCmd: req.StartCmd, ReadyCmd: req.ReadyCmd, CPUs: b.cpus, MemoryMB: b.memoryMB}
	from := strings.TrimSpace(req.FromTemplate)
	if (spec.FromImage == "") == (from == "") {
		return spec, errdefs.Invalid("give exactly one of fromImage and fromTemplate (got fromImage %q, fromTemplate %q)", req.FromImage, req.FromTemplate)
	}
	if from != "" {
		alias, _, err := parseName(from)
		if err != nil {
			return spec, fmt.Errorf("fromTemplate: %w", err)
		}
		if _, err := s.backend(r).GetTemplate(r.Context(), alias); err != nil {
			return spec, errdefs.Invalid("fromTemplate %q: no such template on this server (GET /templates lists them)", from)
		}
		spec.FromTemplate = alias
	}
	if reg := req.FromImageRegistry; reg != nil {
		switch {
		case spec.FromImage == "":
			return spec, errdefs.Invalid("fromImageRegistry is set but fromImage is not")
		case reg.Type != "registry":
			return spec, errdefs.Invalid("fromImageRegistry type %q is not supported here: give username and password (type \"registry\"), or import the image with `agentenv template build --image`", reg.Type)
		case reg.Username == "" || reg.Password == "":
			return spec, errdefs.Invalid("fromImageRegistry needs both username and password")
		}
		spec.Registry = &imagebuild.RegistryAuth{Username: reg.Username, Password: reg.Password}
	}
	if len(req.Steps) > maxSteps {
		return spec, errdefs.Invalid("%d steps: at most %d per build", len(req.Steps), maxSteps)
	}
	// The builder sees a COPY step's files by the server's hash of their
	// bytes (what its layer cache is keyed by), never the client's.
	byDigest := map[string]string{}
	for i, st := range req.Steps {
		if err := checkStep(tb, b.owner, b.templateID, st); err != nil {
			return spec, fmt.Errorf("step %d (%s): %w", i+1, st.Type, err)
		}
		files := st.FilesHash
		if st.Type == "COPY" {
			d, err := tb.files.digest(b.owner, b.templateID, st.FilesHash)
			if err != nil {
				return spec, fmt.Errorf("step %d (COPY): %w", i+1, err)
			}
			byDigest[d], files = st.FilesHash, d
		}
		spec.Steps = append(spec.Steps, imagebuild.Step{Type: st.Type, Args: st.Args, FilesHash: files, Force: st.Force})
	}
	owner, tid := b.owner, b.templateID
	spec.Files = func(digest string) (io.ReadCloser, error) {
		hash, ok := byDigest[digest]
		if !ok {
			return nil, errdefs.Invalid("no COPY step of this build has files of SHA-256 %s", digest)
		}
		return tb.files.open(owner, tid, hash)
	}
	return spec, nil
}

func checkStep(tb *TemplateBuilds, owner, templateID string, st wire.TemplateStep) error {
	n := len(st.Args)
	switch st.Type {
	case "RUN":
		if n < 1 || n > 2 || strings.TrimSpace(st.Args[0]) == "" {
			return errdefs.Invalid("RUN takes [command, user?] with a command")
		}
	case "COPY":
		if n < 2 || n > 4 || st.Args[0] == "" || st.Args[1] == "" {
			return errdefs.Invalid("COPY takes [src, dest, owner?, mode?]")
		}
		if n == 4 && st.Args[3] != "" {
			if _, err := strconv.ParseUint(st.Args[3], 8, 32); err != nil {
				return errdefs.Invalid("COPY mode %q is not an octal mode such as 0755", st.Args[3])
			}
		}
		if err := checkFilesHash(st.FilesHash); err != nil {
			return err
		}
		if !tb.files.present(owner, templateID, st.FilesHash) {
			return errdefs.Invalid("the files of %q (hash %s) were not uploaded: GET /templates/%s/files/%s gives the URL to PUT them to", st.Args[0], st.FilesHash, templateID, st.FilesHash)
		}
	case "ENV":
		if n == 0 || n%2 != 0 {
			return errdefs.Invalid("ENV takes [key1, value1, key2, value2, ...]")
		}
		for i := 0; i < n; i += 2 {
			if st.Args[i] == "" || strings.ContainsAny(st.Args[i], "=\x00") {
				return errdefs.Invalid("ENV name %q: give a name without '='", st.Args[i])
			}
		}
	case "WORKDIR", "USER":
		if n != 1 || strings.TrimSpace(st.Args[0]) == "" {
			return errdefs.Invalid("%s takes one non-empty argument", st.Type)
		}
	default:
		return errdefs.Invalid("unknown step type %q: use RUN, COPY, ENV, WORKDIR or USER", st.Type)
	}
	return nil
}

func (s *Server) stepBuildStatus(w http.ResponseWriter, r *http.Request) {
	tb := s.templateBuilds(w)
	if tb == nil {
		return
	}
	b, err := tb.get(identityOf(r.Context()), r.PathValue("templateID"), r.PathValue("buildID"))
	if err != nil {
		writeError(w, err)
		return
	}
	q := r.URL.Query()
	offset, limit := 0, 100
	if v := q.Get("logsOffset"); v != "" {
		if offset, err = strconv.Atoi(v); err != nil || offset < 0 {
			writeError(w, errdefs.Invalid("logsOffset %q: give the number of log entries already read (0 or more)", v))
			return
		}
	}
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 0 || limit > 100 {
			writeError(w, errdefs.Invalid("limit %q: give 0 to 100", v))
			return
		}
	}
	level := q.Get("level")
	switch level {
	case "", "debug", "info", "warn", "error":
	default:
		writeError(w, errdefs.Invalid("level %q: use debug, info, warn or error", level))
		return
	}
	writeJSON(w, http.StatusOK, b.info(offset, limit, level))
}

// stepBuildLogs is E2B's log route: entries from a time cursor (Unix
// milliseconds) forward (oldest first, from 0 by default) or backward
// (newest first, from now), at most limit at or above level. All logs
// are kept in memory with the build: source is accepted and ignored.
func (s *Server) stepBuildLogs(w http.ResponseWriter, r *http.Request) {
	tb := s.templateBuilds(w)
	if tb == nil {
		return
	}
	b, err := tb.get(identityOf(r.Context()), r.PathValue("templateID"), r.PathValue("buildID"))
	if err != nil {
		writeError(w, err)
		return
	}
	q := r.URL.Query()
	limit, backward := 100, false
	var cursor int64 = -1
	switch q.Get("direction") {
	case "", "forward":
	case "backward":
		backward = true
	default:
		err = errdefs.Invalid("direction %q: use forward or backward", q.Get("direction"))
	}
	if v := q.Get("cursor"); v != "" && err == nil {
		if cursor, err = strconv.ParseInt(v, 10, 64); err != nil || cursor < 0 {
			err = errdefs.Invalid("cursor %q: give a time in Unix milliseconds", v)
		}
	}
	if v := q.Get("limit"); v != "" && err == nil {
		if limit, err = strconv.Atoi(v); err != nil || limit < 0 || limit > 100 {
			err = errdefs.Invalid("limit %q: give 0 to 100", v)
		}
	}
	level := q.Get("level")
	switch level {
	case "", "debug", "info", "warn", "error":
	default:
		err = errdefs.Invalid("level %q: use debug, info, warn or error", level)
	}
	switch src := q.Get("source"); src {
	case "", "temporary", "persistent":
	default:
		err = errdefs.Invalid("source %q: use temporary or persistent", src)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.TemplateBuildLogsResponse{Logs: b.logsFrom(cursor, backward, limit, level)})
}

// templateAlias answers whether a template of that name exists (the
// SDK's Template.exists), and with a tag ("alias:tag") whether the tag is
// the template's, so that a caller that builds what does not exist builds
// a missing tag too. Every key may start sandboxes from every template,
// so another key's template exists for the caller as well.
func (s *Server) templateAlias(w http.ResponseWriter, r *http.Request) {
	alias, tag, err := parseName(r.PathValue("alias"))
	if err == nil {
		_, err = s.backend(r).GetTemplate(r.Context(), alias)
	}
	if err == nil && tag != "" && tag != "default" {
		if tb := s.cfg.TemplateBuilds; tb == nil || !tb.hasTag(alias, tag) {
			err = errdefs.NotFound("template %q has no tag %q (GET /templates/%s/tags lists them)", alias, tag, alias)
		}
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.TemplateAliasResponse{TemplateID: alias})
}

func (s *Server) assignTags(w http.ResponseWriter, r *http.Request) {
	tb := s.templateBuilds(w)
	if tb == nil {
		return
	}
	var req wire.AssignTemplateTagsRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	alias, tag, err := parseName(req.Target)
	if err == nil {
		err = checkTags(req.Tags, "assign")
	}
	var t service.TemplateInfo
	if err == nil {
		t, err = s.backend(r).GetTemplate(r.Context(), alias)
	}
	if err == nil {
		err = t.ChangeableBy(identityOf(r.Context()).Name)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	if tag == "" {
		tag = "default"
	}
	buildID, ok := tb.files.tagged(alias, tag)
	if !ok && tag != "default" {
		writeError(w, errdefs.NotFound("template %q has no tag %q (GET /templates/%s/tags lists them)", alias, tag, alias))
		return
	}
	if !ok {
		buildID = t.EnvdHash // a template built another way: its build ID as GET /templates shows it
	}
	if err := tb.files.setTags(alias, buildID, req.Tags); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, wire.AssignedTemplateTags{BuildID: buildID, Tags: req.Tags})
}

func (s *Server) deleteTags(w http.ResponseWriter, r *http.Request) {
	tb := s.templateBuilds(w)
	if tb == nil {
		return
	}
	var req wire.DeleteTemplateTagsRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	alias, _, err := parseName(req.Name)
	if err == nil {
		err = checkTags(req.Tags, "delete")
	}
	var t service.TemplateInfo
	if err == nil {
		t, err = s.backend(r).GetTemplate(r.Context(), alias)
	}
	if err == nil {
		err = t.ChangeableBy(identityOf(r.Context()).Name)
	}
	if err == nil {
		err = tb.files.deleteTags(alias, req.Tags)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) listTags(w http.ResponseWriter, r *http.Request) {
	if r.PathValue("sub") != "tags" {
		writeError(w, errdefs.NotFound("no route %s %s (see api/openapi.yaml)", r.Method, r.URL.Path))
		return
	}
	tb := s.templateBuilds(w)
	if tb == nil {
		return
	}
	tid := r.PathValue("templateID")
	err := template.ValidName(tid)
	if err == nil {
		_, err = s.backend(r).GetTemplate(r.Context(), tid)
	}
	var out []wire.TemplateTag
	if err == nil {
		out, err = tb.files.listTags(tid)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// resolveTag turns E2B's "alias:tag" in a create into the template's
// name when the tag is the template's (only the newest build of a
// template is kept, so every tag starts it); anything else is left as it
// is.
func (s *Server) resolveTag(name string) string {
	tb := s.cfg.TemplateBuilds
	alias, tag, ok := strings.Cut(name, ":")
	if tb == nil || !ok {
		return name
	}
	if _, known := tb.files.tagged(alias, tag); known || tag == "default" {
		return alias
	}
	return name
}

// checkTags checks the tags of a request to verb them: at least one, each
// a valid tag.
func checkTags(tags []string, verb string) error {
	if len(tags) == 0 {
		return errdefs.Invalid("tags: give at least one tag to %s", verb)
	}
	for _, t := range tags {
		if err := checkTag(t); err != nil {
			return err
		}
	}
	return nil
}
