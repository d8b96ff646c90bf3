package spare

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"
)

func testWarm(size int, dropped *[]int) *Warm[int] {
	p := &Warm[int]{Ready: func(string) bool { return false }}
	p.Init(Host[int]{
		Size: size, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Templates: func() []string { return []string{"img"} },
		Preparing: func(string) bool { return false },
		Make:      func(context.Context, string) error { return nil },
		Drop:      func(_ context.Context, x int) { *dropped = append(*dropped, x) },
	})
	return p
}

// TestWarmDemandAndTrim: a demand raises a template's target (to Size at
// least) until it lapses; trim cuts the extra and says whether the pool is
// short; Pop takes the first match and makes refills wait Quiet.
func TestWarmDemandAndTrim(t *testing.T) {
	var dropped []int
	p := testWarm(1, &dropped)
	if _, short, _ := p.trim("img", false); short {
		t.Error("short with no demand and not ready")
	}
	p.Want("img", 3)
	if _, short, _ := p.trim("img", false); !short {
		t.Error("not short after a demand of 3")
	}
	for i := range 4 {
		p.Add("img", i)
	}
	extra, short, _ := p.trim("img", false)
	if short || len(extra) != 1 || extra[0] != 3 {
		t.Errorf("trim with 4 of 3: extra %v short %v, want [3] false", extra, short)
	}
	x, ok := p.Pop("img", func(x int) bool { return x == 1 })
	if !ok || x != 1 || p.Listed("img") != 2 {
		t.Errorf("pop: %d %v, %d left; want 1 true, 2 left", x, ok, p.Listed("img"))
	}
	if _, _, quiet := p.trim("img", false); quiet <= 0 || quiet > Quiet {
		t.Errorf("quiet after a take: %v, want in (0, %v]", quiet, Quiet)
	}
	p.demand["img"] = demand{n: 3, until: time.Now().Add(-time.Second)}
	if extra, _, _ := p.trim("img", true); len(extra) != 1 {
		t.Errorf("a lapsed demand on a ready template: cut %v, want 1 (down to Size)", extra)
	}
	p.DropOf("img")
	if p.Listed("img") != 0 || len(dropped) != 1 {
		t.Errorf("after DropOf: %d listed, dropped %v", p.Listed("img"), dropped)
	}
}

// TestMakeOneCountsAndRespectsPreparing: a spare being made counts as
// held; none is made while its template is being prepared.
func TestMakeOneCountsAndRespectsPreparing(t *testing.T) {
	var dropped []int
	p := testWarm(1, &dropped)
	ran, _ := p.MakeOne("img", func() error {
		if p.Held("img") != 1 {
			t.Errorf("held while making: %d, want 1", p.Held("img"))
		}
		p.Add("img", 7)
		return nil
	})
	if !ran || p.Held("img") != 1 {
		t.Errorf("after making: ran %v, held %d; want true, 1", ran, p.Held("img"))
	}
	p.host.Preparing = func(string) bool { return true }
	if ran, _ := p.MakeOne("img", func() error { return nil }); ran {
		t.Error("made a spare of a template being prepared")
	}
	p.dropAll()
	if len(dropped) != 1 || p.Held("img") != 0 {
		t.Errorf("after dropAll: dropped %v, held %d", dropped, p.Held("img"))
	}
}

// TestHotPopRemove: the hot pool hands out its last ID and forgets a
// killed one.
func TestHotPopRemove(t *testing.T) {
	var p Hot
	p.Init(Host[string]{})
	p.Add("img", "a")
	p.Add("img", "b")
	p.Add("img", "c")
	p.Remove("img", "b")
	if id, ok := p.Pop("img"); !ok || id != "c" {
		t.Errorf("pop: %q %v, want c", id, ok)
	}
	if got := p.Counts()["img"]; got != 1 {
		t.Errorf("count: %d, want 1", got)
	}
}
