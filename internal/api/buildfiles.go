package api

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	wire "github.com/agentenv/agentenv/api"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/template"
)

// buildFiles keeps what E2B's template builds leave between builds: the
// archives COPY steps upload (content-addressed by the client's files
// hash, per template: <dir>/<template>/files/<hash>) and each template's
// tags (<dir>/<template>/tags.json). Upload URLs carry a token signed with
// a key made at start, so they need no API key (the SDK's PUT sends none)
// and die with the server.
type buildFiles struct {
	dir string
	key []byte

	mu sync.Mutex // tags files
}

// uploadTTL is how long an upload URL works (E2B's signed URLs: 30 min).
const uploadTTL = 30 * time.Minute

var filesHashRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

func openBuildFiles(dir string) (*buildFiles, error) {
	if dir == "" {
		return nil, errors.New("template builds: no directory for uploaded files")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("template build files: %w", err)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	return &buildFiles{dir: dir, key: key}, nil
}

func checkFilesHash(hash string) error {
	if !filesHashRE.MatchString(hash) {
		return errdefs.Invalid("invalid files hash %q: want 64 lower-case hex digits (the SDK's SHA-256 of a COPY step)", hash)
	}
	return nil
}

func (f *buildFiles) path(templateID, hash string) string {
	return filepath.Join(f.dir, templateID, "files", hash)
}

// present reports whether the archive hash of templateID is stored.
func (f *buildFiles) present(templateID, hash string) bool {
	fi, err := os.Stat(f.path(templateID, hash))
	return err == nil && fi.Mode().IsRegular()
}

// open opens a stored archive (imagebuild.Spec.Files).
func (f *buildFiles) open(templateID, hash string) (io.ReadCloser, error) {
	if err := checkFilesHash(hash); err != nil {
		return nil, err
	}
	r, err := os.Open(f.path(templateID, hash))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.Invalid("the files of COPY hash %s were never uploaded for template %q (GET /templates/%s/files/%s gives the upload URL)", hash, templateID, templateID, hash)
	}
	return r, err
}

// token signs an upload of hash for templateID, valid until exp.
func (f *buildFiles) token(templateID, hash string, exp time.Time) string {
	e := strconv.FormatInt(exp.Unix(), 10)
	m := hmac.New(sha256.New, f.key)
	fmt.Fprintf(m, "upload\n%s\n%s\n%s", templateID, hash, e)
	return e + "." + hex.EncodeToString(m.Sum(nil))
}

// checkToken checks an upload URL's token.
func (f *buildFiles) checkToken(templateID, hash, tok string, now time.Time) error {
	e, _, ok := strings.Cut(tok, ".")
	sec, err := strconv.ParseInt(e, 10, 64)
	if !ok || err != nil || !hmac.Equal([]byte(tok), []byte(f.token(templateID, hash, time.Unix(sec, 0)))) {
		return fmt.Errorf("upload token missing or not valid for this template and hash (get a fresh URL from GET /templates/%s/files/%s): %w", templateID, hash, errdefs.ErrUnauthenticated)
	}
	if now.Unix() > sec {
		return fmt.Errorf("upload URL expired at %s (get a fresh one from GET /templates/%s/files/%s): %w", time.Unix(sec, 0).UTC().Format(time.RFC3339), templateID, hash, errdefs.ErrUnauthenticated)
	}
	return nil
}

// store writes an archive: into a temporary file, renamed into place once
// complete, so a half upload is never present. It reports whether the
// hash was new.
func (f *buildFiles) store(templateID, hash string, body io.Reader, max int64) (created bool, err error) {
	dir := filepath.Dir(f.path(templateID, hash))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, err
	}
	tmp, err := os.CreateTemp(dir, ".upload-*")
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name())
	n, err := io.Copy(tmp, io.LimitReader(body, max+1))
	if err == nil && n > max {
		err = fmt.Errorf("the archive is larger than this server's limit of %d bytes (serve --max-copy-upload-mb): copy fewer files: %w", max, errdefs.ErrTooLarge)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, err
	}
	created = !f.present(templateID, hash)
	return created, os.Rename(tmp.Name(), f.path(templateID, hash))
}

// remove forgets a template's files and tags (it was deleted).
func (f *buildFiles) remove(templateID string) error {
	if template.ValidName(templateID) != nil {
		return nil
	}
	return os.RemoveAll(filepath.Join(f.dir, templateID))
}

// tagRecord is one tag as stored.
type tagRecord struct {
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

func (f *buildFiles) tagsPath(templateID string) string {
	return filepath.Join(f.dir, templateID, "tags.json")
}

func (f *buildFiles) readTagsLocked(templateID string) (map[string]tagRecord, error) {
	out := map[string]tagRecord{}
	b, err := os.ReadFile(f.tagsPath(templateID))
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("tags of template %q: %w", templateID, err)
	}
	return out, nil
}

func (f *buildFiles) writeTagsLocked(templateID string, tags map[string]tagRecord) error {
	b, err := json.Marshal(tags)
	if err != nil {
		return err
	}
	p := f.tagsPath(templateID)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// setTags points tags at buildID (a finished build).
func (f *buildFiles) setTags(templateID, buildID string, tags []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	all, err := f.readTagsLocked(templateID)
	if err != nil {
		return err
	}
	now := time.Now().UTC()
	for _, t := range tags {
		all[t] = tagRecord{BuildID: buildID, CreatedAt: now}
	}
	return f.writeTagsLocked(templateID, all)
}

// tagged returns the build a tag of templateID names.
func (f *buildFiles) tagged(templateID, tag string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	all, err := f.readTagsLocked(templateID)
	if err != nil {
		return "", false
	}
	r, ok := all[tag]
	return r.BuildID, ok
}

// deleteTags removes tags of templateID; unknown ones are ErrNotFound.
func (f *buildFiles) deleteTags(templateID string, tags []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	all, err := f.readTagsLocked(templateID)
	if err != nil {
		return err
	}
	for _, t := range tags {
		if _, ok := all[t]; !ok {
			return errdefs.NotFound("template %q has no tag %q", templateID, t)
		}
	}
	for _, t := range tags {
		delete(all, t)
	}
	return f.writeTagsLocked(templateID, all)
}

// listTags lists templateID's tags, by name.
func (f *buildFiles) listTags(templateID string) ([]wire.TemplateTag, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	all, err := f.readTagsLocked(templateID)
	if err != nil {
		return nil, err
	}
	out := []wire.TemplateTag{}
	for t, r := range all {
		out = append(out, wire.TemplateTag{Tag: t, BuildID: r.BuildID, CreatedAt: r.CreatedAt})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tag < out[j].Tag })
	return out, nil
}
