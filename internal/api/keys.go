package api

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// Who a request's key says the caller is. One API key (the default) is one
// user, who sees everything; named keys (--api-keys-file) each see and
// control only their own sandboxes, snapshots, volumes, template builds
// and build inputs, and may use every template but change only their own;
// the operator key sees and changes all, and alone may change the fleet.
type identity struct {
	// Name is a named key's name; "" for the single key and the operator.
	Name     string
	Operator bool
}

// all reports whether the caller sees every key's sandboxes.
func (id identity) all() bool { return id.Name == "" }

type identityKey struct{}

func withIdentity(ctx context.Context, id identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

func identityOf(ctx context.Context) identity {
	id, _ := ctx.Value(identityKey{}).(identity)
	return id
}

// MinKeyLen is the shortest named or operator key accepted.
const MinKeyLen = 16

var keyName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)

// LoadKeys reads a file of named API keys: one "NAME KEY" per line
// (whitespace between), blank lines and lines starting with # ignored.
// Names are 1–64 of letters, digits and ._@- ; keys at least MinKeyLen
// characters; neither may repeat. It returns key → name.
func LoadKeys(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--api-keys-file: %w", err)
	}
	defer f.Close()
	keys, names := map[string]string{}, map[string]int{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, fmt.Errorf("--api-keys-file %s line %d: want \"NAME KEY\" (two fields), got %d fields", path, n, len(fields))
		}
		name, key := fields[0], fields[1]
		switch {
		case !keyName.MatchString(name):
			return nil, fmt.Errorf("--api-keys-file %s line %d: name %q: use 1-64 letters, digits and ._@- (starting with a letter or digit)", path, n, name)
		case len(key) < MinKeyLen:
			return nil, fmt.Errorf("--api-keys-file %s line %d: the key of %q is shorter than %d characters: use a long random one (openssl rand -hex 20)", path, n, name, MinKeyLen)
		case names[name] != 0:
			return nil, fmt.Errorf("--api-keys-file %s line %d: name %q was already given on line %d", path, n, name, names[name])
		case keys[key] != "":
			return nil, fmt.Errorf("--api-keys-file %s line %d: %q has the same key as %q: give every name its own", path, n, name, keys[key])
		}
		names[name], keys[key] = n, name
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--api-keys-file %s: %w", path, err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("--api-keys-file %s holds no keys: add lines \"NAME KEY\"", path)
	}
	return keys, nil
}

// CheckKeys reports keys that would make callers ambiguous: the operator
// key or the single key among the named ones, or the two equal.
func CheckKeys(cfg Config) error {
	for key, name := range cfg.APIKeys {
		if cfg.OperatorKey != "" && key == cfg.OperatorKey {
			return fmt.Errorf("named key %q is the operator key: the operator's key must differ from the keys clients hold", name)
		}
		if cfg.APIKey != "" && key == cfg.APIKey {
			return fmt.Errorf("named key %q is the server's single API key: give it its own", name)
		}
	}
	if cfg.OperatorKey != "" && cfg.OperatorKey == cfg.APIKey {
		return fmt.Errorf("the operator key is the API key: the operator's key must differ from the keys clients hold")
	}
	if cfg.APIKey == "" && len(cfg.APIKeys) == 0 {
		return fmt.Errorf("no API key: set AGENTENV_API_KEY or pass --api-keys-file")
	}
	return nil
}

// keyDigest is what keys are compared by: equal-length digests, so a
// constant-time compare leaks nothing of a key's length either.
func keyDigest(k string) [32]byte { return sha256.Sum256([]byte(k)) }

// caller checks the request's key (X-API-Key, as E2B; or a Bearer token)
// and says whose it is. Every route's check is this one function, in
// `agentenv serve` and `agentenv api` alike.
func (s *Server) caller(r *http.Request) (identity, error) {
	key := r.Header.Get("X-API-Key")
	if key == "" {
		if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			key = b
		}
	}
	if key == "" {
		return identity{}, fmt.Errorf("missing API key: send it in the X-API-Key header (see the server's start-up log for where the key is stored): %w", errdefs.ErrUnauthenticated)
	}
	d := keyDigest(key)
	if s.cfg.OperatorKey != "" && subtle.ConstantTimeCompare(d[:], s.operator[:]) == 1 {
		return identity{Operator: true}, nil
	}
	if s.cfg.APIKey != "" && subtle.ConstantTimeCompare(d[:], s.single[:]) == 1 {
		return identity{}, nil
	}
	// A map lookup by digest: its timing says nothing of how close a
	// wrong key came.
	if name, ok := s.named[d]; ok {
		return identity{Name: name}, nil
	}
	return identity{}, fmt.Errorf("wrong API key: %w", errdefs.ErrUnauthenticated)
}
