package envd

import "testing"

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		in    string
		state byte
		ppid  int
		ok    bool
	}{
		{"42 (sleep) Z 1 42 42 0 -1", 'Z', 1, true},
		{"43 (a b) c) S 7 43", 'S', 7, true}, // comm with a space and ')'
		{"44 (sh) R", 0, 0, false},
		{"garbage", 0, 0, false},
	} {
		state, ppid, ok := parseStat([]byte(tc.in))
		if state != tc.state || ppid != tc.ppid || ok != tc.ok {
			t.Errorf("parseStat(%q) = %q, %d, %v; want %q, %d, %v", tc.in, state, ppid, ok, tc.state, tc.ppid, tc.ok)
		}
	}
}
