package recipe

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fenced-dev/fenced"
)

// The group's partition count at the authority.
//
// Two counts must never be worked at once: an item routed to partition
// hash mod 4 by one member and hash mod 8 by another would be worked by
// both, each under a valid lease of a different key. The count is recorded
// where every member reads it in its one listing of the group: in the name
// of each membership key (GROUP/m/<P>/<id>) and in the owner tag of each
// partition lease (its first three characters, P in base 36). A member is
// admitted (at its join, and again whenever its membership lapsed and it
// takes it back) by this check, done after its membership is granted:
//
//   - no live member has another count (else ErrPartitionCount), and
//   - no partition lease is held with another count, or with an owner tag
//     that carries none (else it waits for those leases to end, and gives
//     up with ErrPartitionCount if they stay).
//
// A member takes a partition only while the membership lease that passed
// the check still stands (checked again after each grant). So if members
// X and Y of different counts ever held partitions at once, the one that
// was admitted second would have listed while the other's membership
// (continuous from its check to its grant) or partition lease (continuous
// from its grant) was held, and been refused. A member that lapsed and
// finds a member of another count live when it takes its membership back
// stops with ErrPartitionCount: the group has moved on without it.

// tagCountLen is how many characters of a partition lease's owner tag
// carry the member's partition count, in base 36 (maxPartitions < 36³).
const tagCountLen = 3

// tagHashSpace is the range of the member-ID hash in the rest of the tag:
// 36⁵, five base-36 characters.
const tagHashSpace = 36 * 36 * 36 * 36 * 36

// ownerTag is the OwnerTag of the partition leases of member memberID in a
// group of partitions partitions: the count (tagCountLen characters) and a
// hash of the ID (about 26 bits), so that a listing of the partitions says
// which member holds each and with which count.
func ownerTag(memberID string, partitions int) string {
	h := nameHash("fenced-partitions:"+memberID) % tagHashSpace
	return pad36(uint64(partitions), tagCountLen) + pad36(h, memberTagLen-tagCountLen)
}

// pad36 writes v in base 36, zero-padded to n characters.
func pad36(v uint64, n int) string {
	s := strconv.FormatUint(v, 36)
	return strings.Repeat("0", max(0, n-len(s))) + s
}

// tagPartitions returns the partition count a partition lease's owner
// carries in its tag, or false when it carries none (a lease not taken by
// a member).
func tagPartitions(owner string) (int, bool) {
	if len(owner) < memberTagLen {
		return 0, false
	}
	s := owner[:tagCountLen]
	for _, r := range s {
		if (r < '0' || r > '9') && (r < 'a' || r > 'z') {
			return 0, false
		}
	}
	n, err := strconv.ParseUint(s, 36, 16)
	if err != nil || n < 1 || n > maxPartitions {
		return 0, false
	}
	return int(n), true
}

// countConflicts is what keeps a member of count p out of the group.
type countConflicts struct {
	// live describes the live members of another count.
	live []string
	// held describes the partition leases held with another count or
	// with none; wait is the longest time left on them.
	held []string
	wait time.Duration
}

func (c countConflicts) none() bool { return len(c.live) == 0 && len(c.held) == 0 }

// conflicts returns what in s keeps a member of count p out.
func (s GroupState) conflicts(p int) countConflicts {
	var c countConflicts
	for _, m := range s.Members {
		if m.Partitions != p {
			c.live = append(c.live, fmt.Sprintf("%q with %d", m.ID, m.Partitions))
		}
	}
	for _, i := range slices.Sorted(maps.Keys(s.Leases)) {
		in := s.Leases[i]
		n, ok := tagPartitions(in.Owner)
		switch {
		case !ok:
			c.held = append(c.held, fmt.Sprintf("%s by an owner of no member (%q)", in.Key, in.Owner))
		case n != p:
			c.held = append(c.held, fmt.Sprintf("%s by a member with %d", in.Key, n))
		default:
			continue
		}
		c.wait = max(c.wait, in.Remaining)
	}
	return c
}

// admitError is the ErrPartitionCount a member of count p gets for c.
func (g *Partitions) admitError(c countConflicts) error {
	if len(c.live) > 0 {
		return fmt.Errorf("fenced: partitions %q: %w: this member has %d partitions, live members have %s",
			g.group, ErrPartitionCount, g.n, strings.Join(c.live, ", "))
	}
	return fmt.Errorf("fenced: partitions %q: %w: this member has %d partitions, and partition leases of another count are still held: %s",
		g.group, ErrPartitionCount, g.n, strings.Join(c.held, ", "))
}

// errRetryAdmit means the check found partition leases of another count
// still held: try again once they may have ended.
var errRetryAdmit = errors.New("partition leases of another count are held")

// admit checks the group for member m, whose membership lease was just
// granted, and releases m unless it passes. It returns errRetryAdmit
// (with how long to wait) when only leases of another count are in the
// way, and an ErrPartitionCount error when a member of another count is
// live.
func (g *Partitions) admit(ctx context.Context, m *fenced.Lease) (time.Duration, countConflicts, error) {
	st, err := ReadGroup(ctx, g.c, g.group)
	if err == nil {
		g.mu.Lock()
		g.noteHolders(st)
		g.mu.Unlock()
		c := st.conflicts(g.n)
		switch {
		case c.none():
			return 0, c, nil
		case len(c.live) > 0:
			err = g.admitError(c)
		default:
			err = errRetryAdmit
		}
		m.Release(context.WithoutCancel(ctx))
		return c.wait, c, err
	}
	m.Release(context.WithoutCancel(ctx))
	return 0, countConflicts{}, fmt.Errorf("fenced: partitions %q: join: %w", g.group, err)
}

// join takes the membership and admits it, waiting while only partition
// leases of another count are in the way: for as long as they said they
// had left when first seen, plus as long as the store may keep a dead
// holder's grant and a TTL (g.member.MaxWait). A count that stays held
// past that, or a live member of another count, is ErrPartitionCount.
func (g *Partitions) join(ctx context.Context) (*fenced.Lease, error) {
	var deadline time.Time
	for {
		// A first look without the membership, so that a member waiting
		// here for another count's leases to end is not listed as live
		// (which would stop a member of that count taking its lapsed
		// membership back).
		st, err := ReadGroup(ctx, g.c, g.group)
		if err != nil {
			return nil, fmt.Errorf("fenced: partitions %q: join: %w", g.group, err)
		}
		g.mu.Lock()
		g.noteHolders(st) // the partitions held before we joined: taking one is a move
		g.mu.Unlock()
		c := st.conflicts(g.n)
		if len(c.live) > 0 {
			return nil, g.admitError(c)
		}
		if c.none() {
			m, err := g.c.Acquire(ctx, g.memberKey(), &g.member)
			if err != nil {
				if errors.Is(err, fenced.ErrHeld) {
					return nil, fmt.Errorf("fenced: partitions %q: %w: %q (held for more than %v)",
						g.group, ErrMemberLive, g.id, g.member.MaxWait)
				}
				return nil, fmt.Errorf("fenced: partitions %q: join: %w", g.group, err)
			}
			var wait time.Duration
			wait, c, err = g.admit(ctx, m)
			if err == nil {
				return m, nil
			}
			if !errors.Is(err, errRetryAdmit) {
				return nil, err
			}
			c.wait = wait
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(c.wait + g.member.MaxWait)
		}
		if !now.Before(deadline) {
			return nil, g.admitError(c)
		}
		sleep := min(max(c.wait, 10*time.Millisecond), g.poll, time.Until(deadline))
		t := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("fenced: partitions %q: join: %w", g.group, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// rejoin takes back a lapsed membership, without waiting. It returns nil
// when the membership is not to be had now (held by another process, or
// leases of another count are in the way), and an ErrPartitionCount
// error when a member of another count is live: the member must stop.
func (g *Partitions) rejoin(ctx context.Context) (*fenced.Lease, time.Duration, error) {
	nm, err := g.c.TryAcquire(ctx, g.memberKey(), &g.member)
	if err != nil {
		return nil, 0, nil
	}
	wait, c, err := g.admit(ctx, nm)
	switch {
	case err == nil:
		return nm, 0, nil
	case errors.Is(err, ErrPartitionCount):
		return nil, 0, fmt.Errorf("%w (its membership had lapsed, and the group went on without it: it stopped)", g.admitError(c))
	default:
		return nil, wait, nil
	}
}
