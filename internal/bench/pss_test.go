package bench

import (
	"errors"
	"os"
	"slices"
	"testing"
)

func TestParsePPID(t *testing.T) {
	tests := []struct {
		stat    string
		want    int
		wantErr bool
	}{
		{"17474 (exe) S 17459 17459 1 0 -1 4194560 0 0", 17459, false},
		// A command name with spaces and parentheses.
		{"42 (a) b (c)) R 7 42 42 0", 7, false},
		{"42 exe S 7", 0, true},
		{"42 (exe) S", 0, true},
	}
	for _, tt := range tests {
		got, err := parsePPID([]byte(tt.stat))
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parsePPID(%q) = %d, %v; want %d, error %v", tt.stat, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestDescendants(t *testing.T) {
	procs := map[int]proc{
		1:  {ppid: 0},
		10: {ppid: 1}, // sandbox
		11: {ppid: 10},
		12: {ppid: 10},
		13: {ppid: 12}, // grandchild
		20: {ppid: 1},  // another sandbox
		21: {ppid: 20},
	}
	tests := []struct {
		roots []int
		want  []int
	}{
		{[]int{10}, []int{10, 11, 12, 13}},
		{[]int{20, 10}, []int{10, 11, 12, 13, 20, 21}},
		{[]int{13}, []int{13}},
		{nil, []int{}},
		// A root that ended meanwhile is still reported; reading it finds nothing.
		{[]int{99}, []int{99}},
	}
	for _, tt := range tests {
		if got := descendants(procs, tt.roots); !slices.Equal(got, tt.want) {
			t.Errorf("descendants(%v) = %v, want %v", tt.roots, got, tt.want)
		}
	}
}

func TestRunscProcsOf(t *testing.T) {
	const id = "icd94782b3bba8bed15d9"
	procs := map[int]proc{
		100: {args: []string{"runsc-sandbox", "--root=/x", "boot", "--bundle=/d/sandboxes/" + id + "/bundle", id}},
		101: {args: []string{"runsc-gofer", "--root=/x", "gofer", id}},
		// The runsc CLI naming the sandbox is not part of it.
		102: {args: []string{"/usr/local/bin/runsc", "--root", "/x", "state", id}},
		103: {args: []string{"runsc-sandbox", "boot", "iotherotherotherothe"}},
		104: {args: []string{""}},
		105: {args: []string{id}}, // argv[0] alone does not count
	}
	if got, want := runscProcsOf(procs, id), []int{100, 101}; !slices.Equal(got, want) {
		t.Errorf("runscProcsOf = %v, want %v", got, want)
	}
}

func TestDistinctAddressSpaces(t *testing.T) {
	// 1 alone; 2, 3 and 5 share one address space (systrap stubs); 4 alone.
	space := map[int]int{1: 1, 2: 2, 3: 2, 4: 4, 5: 2}
	same := func(a, b int) (bool, error) { return space[a] == space[b], nil }
	got, err := distinctAddressSpaces([]int{1, 2, 3, 4, 5}, same)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{1, 2, 4}; !slices.Equal(got, want) {
		t.Errorf("distinctAddressSpaces = %v, want %v", got, want)
	}
	boom := errors.New("boom")
	if _, err := distinctAddressSpaces([]int{1, 2}, func(int, int) (bool, error) { return false, boom }); !errors.Is(err, boom) {
		t.Errorf("error from same: got %v, want %v", err, boom)
	}
}

func TestParseSmapsRollup(t *testing.T) {
	const rollup = `55d7c0000000-7ffd2a5fe000 ---p 00000000 00:00 0                          [rollup]
Rss:               40016 kB
Pss:               16191 kB
Pss_Dirty:          9290 kB
Pss_Anon:           8714 kB
Pss_File:           6900 kB
Pss_Shmem:           576 kB
Shared_Clean:      23752 kB
`
	got, err := parseSmapsRollup([]byte(rollup))
	if err != nil {
		t.Fatal(err)
	}
	if want := (pss{Total: 16191, Anon: 8714, File: 6900, Shmem: 576}); got != want {
		t.Errorf("parseSmapsRollup = %+v, want %+v", got, want)
	}
	if _, err := parseSmapsRollup([]byte("Rss: 1 kB\n")); err == nil {
		t.Error("rollup without Pss: got nil error, want one")
	}
	if _, err := parseSmapsRollup([]byte("Pss: x kB\n")); err == nil {
		t.Error("rollup with a bad number: got nil error, want one")
	}
}

// TestOwnPSS reads this test process's own memory, which needs no root.
func TestOwnPSS(t *testing.T) {
	p, err := processesPSS([]int{os.Getpid()})
	if err != nil {
		t.Skipf("cannot read own smaps_rollup or kcmp here: %v", err)
	}
	if p.Total == 0 || p.Total < p.Anon {
		t.Errorf("own PSS = %+v, want a positive total at least the anonymous part", p)
	}
	// The same process twice is one address space, counted once.
	twice, err := processesPSS([]int{os.Getpid(), os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	if twice.Total > p.Total*2-1 {
		t.Errorf("PSS of the same process listed twice = %d KiB, want about %d (counted once)", twice.Total, p.Total)
	}
}
