package api

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadKeys(t *testing.T) {
	tests := []struct {
		name, file string
		want       map[string]string
		err        string // substring of the error; "" for none
	}{
		{name: "two keys, comments and blanks", file: "# team\nalice aaaaaaaaaaaaaaaa\n\n  bob\tbbbbbbbbbbbbbbbbbbbb  \n",
			want: map[string]string{"aaaaaaaaaaaaaaaa": "alice", "bbbbbbbbbbbbbbbbbbbb": "bob"}},
		{name: "one field", file: "alice\n", err: `line 1: want "NAME KEY"`},
		{name: "three fields", file: "alice aaaaaaaaaaaaaaaa extra\n", err: "got 3 fields"},
		{name: "short key", file: "alice short\n", err: "shorter than 16"},
		{name: "bad name", file: "al/ice aaaaaaaaaaaaaaaa\n", err: `name "al/ice"`},
		{name: "name twice", file: "a aaaaaaaaaaaaaaaa\na bbbbbbbbbbbbbbbb\n", err: `line 2: name "a" was already given on line 1`},
		{name: "key twice", file: "a aaaaaaaaaaaaaaaa\nb aaaaaaaaaaaaaaaa\n", err: `"b" has the same key as "a"`},
		{name: "empty", file: "# nobody\n", err: "holds no keys"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "keys")
			os.WriteFile(p, []byte(tt.file), 0o600)
			got, err := LoadKeys(p)
			switch {
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("got error %v, want one with %q", err, tt.err)
			case tt.err == "" && err != nil:
				t.Fatalf("got error %v, want none", err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("key %s: got %q, want %q", k, got[k], v)
				}
			}
		})
	}
	if _, err := LoadKeys(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "--api-keys-file") {
		t.Errorf("missing file: got %v, want an error naming the flag", err)
	}
}

func TestCheckKeys(t *testing.T) {
	named := map[string]string{"aaaaaaaaaaaaaaaa": "alice"}
	for _, tt := range []struct {
		name string
		cfg  Config
		err  string
	}{
		{"single key", Config{APIKey: "k"}, ""},
		{"named keys only", Config{APIKeys: named}, ""},
		{"none", Config{}, "no API key"},
		{"operator among named", Config{APIKeys: named, OperatorKey: "aaaaaaaaaaaaaaaa"}, "is the operator key"},
		{"single among named", Config{APIKeys: named, APIKey: "aaaaaaaaaaaaaaaa"}, "single API key"},
		{"operator is single", Config{APIKey: "bbbbbbbbbbbbbbbb", OperatorKey: "bbbbbbbbbbbbbbbb"}, "operator key is the API key"},
	} {
		err := CheckKeys(tt.cfg)
		if (tt.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%s: got %v, want %q", tt.name, err, tt.err)
		}
	}
}

// TestCaller maps each kind of key to who it is.
func TestCaller(t *testing.T) {
	s := New(Config{APIKey: "single-key", APIKeys: map[string]string{"aaaaaaaaaaaaaaaa": "alice"}, OperatorKey: "operator-key-123456"})
	for _, tt := range []struct {
		header, value string
		want          identity
		ok            bool
	}{
		{"X-API-Key", "single-key", identity{}, true},
		{"X-API-Key", "aaaaaaaaaaaaaaaa", identity{Name: "alice"}, true},
		{"Authorization", "Bearer aaaaaaaaaaaaaaaa", identity{Name: "alice"}, true},
		{"X-API-Key", "operator-key-123456", identity{Operator: true}, true},
		{"X-API-Key", "aaaaaaaaaaaaaaab", identity{}, false},
		{"X-API-Key", "", identity{}, false},
	} {
		r := httptest.NewRequest("GET", "/sandboxes", nil)
		if tt.value != "" {
			r.Header.Set(tt.header, tt.value)
		}
		got, err := s.caller(r)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("%s: %q: got %+v, %v; want %+v (ok %v)", tt.header, tt.value, got, err, tt.want, tt.ok)
		}
	}
}
