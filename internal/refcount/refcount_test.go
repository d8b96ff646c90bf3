package refcount_test

import (
	"sync"
	"testing"

	"github.com/agentenv/agentenv/internal/refcount"
)

func TestReleaseCountsDownOnce(t *testing.T) {
	var mu sync.Mutex
	var last []string
	c := refcount.New(&mu, func(k string) { last = append(last, k) })
	mu.Lock()
	a := c.Hold("x", "y")
	b := c.Hold("x")
	mu.Unlock()
	a()
	a() // a second call must not count down again
	mu.Lock()
	if c.N("x") != 1 || c.N("y") != 0 {
		t.Errorf("after one release: x %d, y %d holders; want 1, 0", c.N("x"), c.N("y"))
	}
	if len(last) != 1 || last[0] != "y" {
		t.Errorf("last holders gone: %v, want [y]", last)
	}
	mu.Unlock()
	b()
	mu.Lock()
	defer mu.Unlock()
	if c.N("x") != 0 || len(last) != 2 || last[1] != "x" {
		t.Errorf("after both releases: x %d holders, last %v", c.N("x"), last)
	}
	n := 0
	c.Each(func(string, int) { n++ })
	if n != 0 {
		t.Errorf("%d keys still held", n)
	}
}

func TestConcurrentHolders(t *testing.T) {
	var mu sync.Mutex
	lasts := 0
	c := refcount.New(&mu, func(string) { lasts++ })
	var wg sync.WaitGroup
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100; j++ {
				mu.Lock()
				release := c.Hold("k")
				mu.Unlock()
				release()
				release()
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if c.N("k") != 0 {
		t.Errorf("%d holders left", c.N("k"))
	}
	if lasts == 0 || lasts > 6400 {
		t.Errorf("the last holder let go %d times", lasts)
	}
}
