package proof

// The generative worker's calls into fenced's recipes, in one file so that
// a move of the recipes to another package changes only this file.

import (
	"context"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/recipe"
)

// recipes are one worker's semaphore and election.
type recipes struct {
	sem   *recipe.Semaphore
	elect *recipe.Election
}

// newRecipes makes the semaphore of permits permits on semName and the
// election on electName, with opts for their leases.
func newRecipes(c *fenced.Client, semName string, permits int, electName string, opts *fenced.LeaseOptions) (*recipes, error) {
	sem, err := recipe.NewSemaphore(c, semName, permits, opts)
	if err != nil {
		return nil, err
	}
	elect, err := recipe.NewElection(c, electName, opts)
	if err != nil {
		return nil, err
	}
	return &recipes{sem: sem, elect: elect}, nil
}

// acquireAll takes every key, all or nothing (fenced's AcquireAll).
func acquireAll(ctx context.Context, c *fenced.Client, keys []string, opts *fenced.LeaseOptions) (*recipe.LeaseSet, error) {
	return recipe.AcquireAll(ctx, c, keys, opts)
}

// permit takes one permit of the semaphore and returns its lease.
func (r *recipes) permit(ctx context.Context) (*fenced.Lease, error) {
	p, err := r.sem.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return p.Lease, nil
}

// campaign runs for the election and returns the leadership's lease.
func (r *recipes) campaign(ctx context.Context) (*fenced.Lease, error) {
	ld, err := r.elect.Campaign(ctx, "")
	if err != nil {
		return nil, err
	}
	return ld.Lease, nil
}
