package sandbox

import (
	"context"
	"errors"
)

// cleanup is a stack of teardown steps for a create path: each acquired
// resource pushes its release; on failure they run in reverse, once, under
// a context that the caller's cancellation cannot cut short. Steps that
// fail are kept for retry, so that nothing stays behind for good.
type cleanup struct {
	steps  []func(context.Context) error
	failed []func(context.Context) error
	done   bool
}

func (c *cleanup) add(f func(context.Context) error) { c.steps = append(c.steps, f) }

// run tears everything down and returns the joined errors.
func (c *cleanup) run(ctx context.Context) error {
	if c.done {
		return nil
	}
	c.done = true
	ctx = context.WithoutCancel(ctx)
	var errs []error
	for i := len(c.steps) - 1; i >= 0; i-- {
		if err := c.steps[i](ctx); err != nil {
			errs = append(errs, err)
			c.failed = append(c.failed, c.steps[i])
		}
	}
	return errors.Join(errs...)
}

// retry runs the steps that failed again, in the same order, and keeps
// those that fail again.
func (c *cleanup) retry(ctx context.Context) error {
	ctx = context.WithoutCancel(ctx)
	steps := c.failed
	c.failed = nil
	var errs []error
	for _, f := range steps {
		if err := f(ctx); err != nil {
			errs = append(errs, err)
			c.failed = append(c.failed, f)
		}
	}
	return errors.Join(errs...)
}

// keep marks the create as successful: nothing will be torn down.
func (c *cleanup) keep() { c.done = true }
