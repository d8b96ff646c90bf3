// Package refcount counts who holds what: the one holder behind every
// store whose entries must outlive their users (templates and their
// layers, snapshots, volumes).
//
// Counts has no lock of its own. Its owner's mutex guards it, so that
// deciding from a count (may this template be deleted?) and changing what
// the count protects happen in one step under that mutex. It must not be
// used without that mutex.
package refcount

import "sync"

// Counts counts the holders of each key.
type Counts[K comparable] struct {
	mu     sync.Locker
	n      map[K]int
	onLast func(K)
}

// New is a Counts guarded by mu. onLast (may be nil) runs under mu when a
// key's last holder lets go.
func New[K comparable](mu sync.Locker, onLast func(K)) *Counts[K] {
	return &Counts[K]{mu: mu, n: map[K]int{}, onLast: onLast}
}

// Hold counts one more holder of each key; the caller holds mu. The release
// takes mu itself and counts down once, however often it is called.
func (c *Counts[K]) Hold(keys ...K) (release func()) {
	for _, k := range keys {
		c.n[k]++
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			for _, k := range keys {
				if c.n[k]--; c.n[k] > 0 {
					continue
				}
				delete(c.n, k)
				if c.onLast != nil {
					c.onLast(k)
				}
			}
		})
	}
}

// N is the number of holders of k; the caller holds mu.
func (c *Counts[K]) N(k K) int { return c.n[k] }

// Each calls fn for every key held, with its count; the caller holds mu.
func (c *Counts[K]) Each(fn func(k K, n int)) {
	for k, n := range c.n {
		fn(k, n)
	}
}
