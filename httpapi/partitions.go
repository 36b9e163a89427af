package httpapi

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/core/limits"
	"github.com/fenced-dev/fenced/recipe"
)

// groupView is a partition group (recipe.Partitions) as the API and the
// dashboard show it.
type groupView struct {
	Store      string    `json:"store"`
	Group      string    `json:"group"`
	Now        time.Time `json:"now"`
	Partitions int       `json:"partitions"`
	// Members are the live members, with how many partitions each holds
	// now and how many the assignment gives it.
	Members []groupMemberView `json:"members"`
	// Partition lists every partition, 0 to P-1.
	Partition []partitionView `json:"partition"`
	// Unowned are the partitions nobody holds: being handed off, or
	// waiting for a dead owner's lease to run out.
	Unowned []int `json:"unowned"`
	// Invalid are the held keys shaped like the group's member or
	// partition keys that no member made (recipe.GroupState.Invalid).
	Invalid []string `json:"invalid"`
}

type groupMemberView struct {
	ID          string `json:"id"`
	Partitions  int    `json:"partitions"` // the member's P
	Owned       int    `json:"owned"`
	Target      int    `json:"target"`
	RemainingMS int64  `json:"remaining_ms"`
}

type partitionView struct {
	Partition   int    `json:"partition"`
	Key         string `json:"key"`
	Held        bool   `json:"held"`
	Owner       string `json:"owner,omitempty"` // the member holding it, when its tag names a live one
	Fence       uint64 `json:"fence"`
	RemainingMS int64  `json:"remaining_ms"`
	Target      string `json:"target"`
}

// groupLink is a partition group on the dashboard's front page, at a
// glance.
type groupLink struct {
	Group      string
	Partitions int
	Members    int
	// Owned counts the partitions whose lease is held (by a live member,
	// or one that died and whose lease has not run out); Unowned the
	// others.
	Owned, Unowned int
	// Moves counts the partitions this server saw change owner (a grant
	// tagged by another member than the last it saw), LastMove when it
	// saw the last one (nil if none).
	Moves    int
	LastMove *time.Time
}

// partitionGroups finds the partition groups in a listing by their live
// members' keys (GROUP/m/P/ID, see recipe.JoinPartitions), sorted by name,
// with their held partitions.
func partitionGroups(infos []fenced.LeaseInfo) []groupLink {
	byName := map[string]int{} // index in out
	var out []groupLink
	for _, in := range infos {
		if !in.Held {
			continue
		}
		rest, id, ok := cutLast(in.Key)
		if !ok || id == "" {
			continue
		}
		rest, ps, ok := cutLast(rest)
		n, err := strconv.Atoi(ps)
		if !ok || err != nil || n < 1 || n > limits.MaxPartitions {
			continue
		}
		group, m, ok := cutLast(rest)
		if !ok || m != "m" || group == "" {
			continue
		}
		i, seen := byName[group]
		if !seen {
			i = len(out)
			byName[group] = i
			out = append(out, groupLink{Group: group, Partitions: n})
		}
		out[i].Members++
	}
	for _, in := range infos {
		group, p, ok := partitionKey(in.Key)
		if i, known := byName[group]; ok && known && in.Held && p < out[i].Partitions {
			out[i].Owned++
		}
	}
	for i := range out {
		out[i].Unowned = out[i].Partitions - out[i].Owned
	}
	slices.SortFunc(out, func(a, b groupLink) int { return strings.Compare(a.Group, b.Group) })
	return out
}

// partitionKey reads a partition key, GROUP/p/<i> (recipe.JoinPartitions).
func partitionKey(key string) (group string, p int, ok bool) {
	rest, ps, ok := cutLast(key)
	if !ok {
		return "", 0, false
	}
	group, name, ok := cutLast(rest)
	n, err := strconv.Atoi(ps)
	if !ok || name != "p" || group == "" || err != nil || n < 0 || n >= limits.MaxPartitions || ps != strconv.Itoa(n) {
		return "", 0, false
	}
	return group, n, true
}

// groupKeyGroup returns what a key of a partition group is grouped by in
// the store-level series: the group's name, for its partitions
// (GROUP/p/<i>), its members (GROUP/m/<P>/<id>) and its doorbell
// (GROUP/w/bell), so that a group's label values are bounded whatever P
// and the member IDs; any other key itself.
func groupKeyGroup(key string) string {
	if group, _, ok := partitionKey(key); ok {
		return group
	}
	if group, ok := strings.CutSuffix(key, "/w/bell"); ok && group != "" {
		return group
	}
	rest, id, ok := cutLast(key)
	if !ok || id == "" {
		return key
	}
	rest, ps, ok := cutLast(rest)
	n, err := strconv.Atoi(ps)
	if !ok || err != nil || n < 1 || n > limits.MaxPartitions {
		return key
	}
	if group, m, ok := cutLast(rest); ok && m == "m" && group != "" {
		return group
	}
	return key
}

// cutLast splits s at its last slash.
func cutLast(s string) (before, after string, ok bool) {
	i := strings.LastIndexByte(s, '/')
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+1:], true
}

// groupDetails reads group in one listing.
func (s *Server) groupDetails(ctx context.Context, group string) (groupView, *apiError) {
	if err := fenced.ValidateKey(group + "/p/0"); err != nil {
		return groupView{}, storeError(err)
	}
	st, err := recipe.ReadGroup(ctx, s.cfg.Client, group)
	if err != nil {
		return groupView{}, storeError(err)
	}
	p := st.Partitions()
	v := groupView{Store: s.cfg.Store, Group: group, Now: s.cfg.Now().UTC(), Partitions: p,
		Members: []groupMemberView{}, Partition: make([]partitionView, p), Unowned: []int{}, Invalid: []string{}}
	v.Invalid = append(v.Invalid, st.Invalid...)
	target := map[int]string{}
	targets := st.Targets()
	for id, ps := range targets {
		for _, i := range ps {
			target[i] = id
		}
	}
	owned := map[string]int{}
	for i := range v.Partition {
		pv := partitionView{Partition: i, Key: group + "/p/" + strconv.Itoa(i), Target: target[i]}
		if in, ok := st.Leases[i]; ok {
			pv.Held, pv.Fence, pv.RemainingMS, pv.Owner = true, in.Fence, in.Remaining.Milliseconds(), st.Owners[i]
			owned[pv.Owner]++
		} else {
			v.Unowned = append(v.Unowned, i)
		}
		v.Partition[i] = pv
	}
	for _, m := range st.Members {
		v.Members = append(v.Members, groupMemberView{ID: m.ID, Partitions: m.Partitions, Owned: owned[m.ID],
			Target: len(targets[m.ID]), RemainingMS: m.Remaining.Milliseconds()})
	}
	slices.Sort(v.Unowned)
	return v, nil
}

func (s *Server) getGroup(w http.ResponseWriter, r *http.Request) {
	v, aerr := s.groupDetails(r.Context(), r.PathValue("group"))
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

type groupPage struct {
	groupView
	Error string
}

func (s *Server) groupPage(w http.ResponseWriter, r *http.Request) {
	v, aerr := s.groupDetails(r.Context(), r.PathValue("group"))
	p := groupPage{groupView: v}
	if aerr != nil {
		p.Store, p.Group, p.Error = s.cfg.Store, r.PathValue("group"), aerr.Message
	}
	s.render(w, "partitions.html", p)
}
