package api

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
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

	wire "github.com/agentenv/agentenv/client/api"
	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/template"
)

// buildFiles keeps what E2B's template builds leave between builds: the
// archives COPY steps upload and each template's tags
// (<dir>/<template>/tags.json). Archives are per owner (the API key the
// upload URL was given to) and template, named by the client's files hash:
// <dir>/_files/<owner>/<template>/<hash>, beside <hash>.sha256, the
// server's SHA-256 of the bytes it received. The client's hash covers its
// own directory sizes, which no archive carries, so the server cannot
// recompute it: what it trusts is its own hash, which keys the layer
// cache. An archive is never replaced. Upload URLs carry a token signed
// with a key made at start, bound to owner, template and hash, so they
// need no API key (the SDK's PUT sends none) and die with the server.
type buildFiles struct {
	dir string
	key []byte

	mu sync.Mutex // tags files
}

// uploadTTL is how long an upload URL works (E2B's signed URLs: 30 min).
const uploadTTL = 30 * time.Minute

var filesHashRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// filesDir holds the archives, per owner; no template is named so (names
// start with a letter or digit).
const filesDir = "_files"

// ownerDir is an owner's directory name: the key's name (which starts with
// a letter or digit), or "_operator" for the operator and the single key.
func ownerDir(owner string) string {
	if owner == "" {
		return "_operator"
	}
	return owner
}

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

func (f *buildFiles) path(owner, templateID, hash string) string {
	return filepath.Join(f.dir, filesDir, ownerDir(owner), templateID, hash)
}

// present reports whether owner's archive hash of templateID is stored.
func (f *buildFiles) present(owner, templateID, hash string) bool {
	fi, err := os.Stat(f.path(owner, templateID, hash))
	return err == nil && fi.Mode().IsRegular()
}

// open opens owner's stored archive.
func (f *buildFiles) open(owner, templateID, hash string) (io.ReadCloser, error) {
	if err := checkFilesHash(hash); err != nil {
		return nil, err
	}
	r, err := os.Open(f.path(owner, templateID, hash))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.Invalid("the files of COPY hash %s were never uploaded for template %q (GET /templates/%s/files/%s gives the upload URL)", hash, templateID, templateID, hash)
	}
	return r, err
}

// digest is the server's SHA-256 (hex) of owner's archive hash: from its
// .sha256 file, or hashed again (and written) if a crash lost that.
func (f *buildFiles) digest(owner, templateID, hash string) (string, error) {
	p := f.path(owner, templateID, hash)
	if b, err := os.ReadFile(p + ".sha256"); err == nil && filesHashRE.Match(b) {
		return string(b), nil
	}
	r, err := f.open(owner, templateID, hash)
	if err != nil {
		return "", err
	}
	defer r.Close()
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		return "", err
	}
	d := hex.EncodeToString(h.Sum(nil))
	return d, atomicfile.WriteFile(p+".sha256", []byte(d), 0o600)
}

// token signs an upload of hash for owner's templateID, valid until exp:
// "EXP.OWNER.MAC", the owner (base64url) carried so that the PUT, which
// has no API key, knows whose archive it is.
func (f *buildFiles) token(owner, templateID, hash string, exp time.Time) string {
	e := strconv.FormatInt(exp.Unix(), 10)
	o := ownerDir(owner)
	m := hmac.New(sha256.New, f.key)
	fmt.Fprintf(m, "upload\n%s\n%s\n%s\n%s", o, templateID, hash, e)
	return e + "." + base64.RawURLEncoding.EncodeToString([]byte(o)) + "." + hex.EncodeToString(m.Sum(nil))
}

// checkToken checks an upload URL's token and returns the owner it was
// given to.
func (f *buildFiles) checkToken(templateID, hash, tok string, now time.Time) (owner string, err error) {
	parts := strings.Split(tok, ".")
	bad := fmt.Errorf("upload token missing or not valid for this template and hash (get a fresh URL from GET /templates/%s/files/%s): %w", templateID, hash, errdefs.ErrUnauthenticated)
	if len(parts) != 3 {
		return "", bad
	}
	sec, err := strconv.ParseInt(parts[0], 10, 64)
	o, oerr := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil || oerr != nil {
		return "", bad
	}
	owner = string(o)
	if owner == ownerDir("") {
		owner = ""
	}
	if !hmac.Equal([]byte(tok), []byte(f.token(owner, templateID, hash, time.Unix(sec, 0)))) {
		return "", bad
	}
	if now.Unix() > sec {
		return "", fmt.Errorf("upload URL expired at %s (get a fresh one from GET /templates/%s/files/%s): %w", time.Unix(sec, 0).UTC().Format(time.RFC3339), templateID, hash, errdefs.ErrUnauthenticated)
	}
	return owner, nil
}

// store writes owner's archive, hashing what it receives: into a
// temporary file, linked into place once complete (a half upload is never
// present) and never over an archive already there. want, if set, is the
// SHA-256 (hex) the client says the bytes have: a mismatch is refused.
// Another upload of a stored hash is accepted only with the same bytes
// (created false). It returns the server's hash of the bytes.
func (f *buildFiles) store(owner, templateID, hash string, body io.Reader, max int64, want string) (digest string, created bool, err error) {
	final := f.path(owner, templateID, hash)
	dir := filepath.Dir(final)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", false, err
	}
	tmp, err := os.CreateTemp(dir, ".upload-*")
	if err != nil {
		return "", false, err
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(body, max+1))
	if err == nil && n > max {
		err = fmt.Errorf("the archive is larger than this server's limit of %d bytes (serve --max-copy-upload-mb): copy fewer files: %w", max, errdefs.ErrTooLarge)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", false, err
	}
	digest = hex.EncodeToString(h.Sum(nil))
	if want != "" && want != digest {
		return "", false, errdefs.Invalid("the archive received has SHA-256 %s, not %s as the upload said: it was changed or cut on the way; upload it again", digest, want)
	}
	// A link, not a rename: it fails rather than replace what is there.
	if err := os.Link(tmp.Name(), final); errors.Is(err, fs.ErrExist) {
		have, err := f.digest(owner, templateID, hash)
		if err != nil {
			return "", false, err
		}
		if have != digest {
			return "", false, errdefs.Conflict("files hash %s of template %q was already uploaded with other bytes (SHA-256 %s, these are %s); an uploaded archive is never replaced: a changed file gives a new files hash, so build again with the SDK", hash, templateID, have, digest)
		}
		return digest, false, nil
	} else if err != nil {
		return "", false, err
	}
	return digest, true, atomicfile.WriteFile(final+".sha256", []byte(digest), 0o600)
}

// remove forgets a template's files, every owner's, and its tags (it was
// deleted).
func (f *buildFiles) remove(templateID string) error {
	if template.ValidName(templateID) != nil {
		return nil
	}
	dirs, _ := filepath.Glob(filepath.Join(f.dir, filesDir, "*", templateID))
	errs := []error{os.RemoveAll(filepath.Join(f.dir, templateID))}
	for _, d := range dirs {
		errs = append(errs, os.RemoveAll(d))
	}
	return errors.Join(errs...)
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
	return atomicfile.WriteFile(p, b, 0o600)
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
