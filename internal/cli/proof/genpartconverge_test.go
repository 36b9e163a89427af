package proof

import (
	"slices"
	"testing"

	"github.com/fenced-dev/fenced/recipe"
)

// TestStragglers: converge replaces the live members of an old count only
// while no member of the current count is live.
func TestStragglers(t *testing.T) {
	members := func(ms ...recipe.GroupMember) recipe.GroupState { return recipe.GroupState{Members: ms} }
	for _, c := range []struct {
		name string
		st   recipe.GroupState
		want []int
	}{
		{"none live", members(), nil},
		{"only the current count", members(recipe.GroupMember{ID: "m0", Partitions: 6}), nil},
		{"both counts", members(recipe.GroupMember{ID: "m0", Partitions: 6}, recipe.GroupMember{ID: "m2", Partitions: 4}), nil},
		{"only an old count", members(recipe.GroupMember{ID: "m2", Partitions: 4}), []int{2}},
		{"two old counts", members(recipe.GroupMember{ID: "m1", Partitions: 2}, recipe.GroupMember{ID: "m3", Partitions: 4}),
			[]int{1, 3}},
	} {
		if got := stragglers(c.st, 6); !slices.Equal(got, c.want) {
			t.Errorf("%s: stragglers = %v, want %v", c.name, got, c.want)
		}
	}
}
