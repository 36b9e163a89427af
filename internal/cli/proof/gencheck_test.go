package proof

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
)

// TestCheckGenFindsEachViolation feeds CheckGen small histories, each with
// one violation of a generative check, and one without.
func TestCheckGenFindsEachViolation(t *testing.T) {
	ms := int64(time.Millisecond)
	ttl, bound := 5*time.Second, 2*time.Second
	clean := []Event{
		{T: 1 * ms, Kind: AcquireInvoke, Op: 1, Name: "acquire", Key: "k"},
		{T: 2 * ms, Kind: AcquireOK, Op: 1, Name: "acquire", Key: "k", Fence: 1, Owner: "a"},
		{T: 3 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 1, Owner: "a"},
		{T: 9000 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 1, Owner: "a"},
		{T: 9001 * ms, Kind: AcquireInvoke, Op: 2, Name: "all", Key: "k"},
		{T: 9500 * ms, Kind: AcquireOK, Op: 3, Key: "j", Fence: 7, Owner: "b"},
		{T: 9600 * ms, Kind: SetMember, Op: 2, Name: "all", Key: "k", Fence: 5, Owner: "c", Value: 1},
		// An orphan released within the bound.
		{T: 9700 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 3, Owner: "x"},
		{T: 10500 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 3, Owner: "x"},
	}
	if r := CheckGen(append([]Event(nil), clean...), fenced.FenceStrict, ttl, bound); r.Failed() || r.Ops != 2 || r.Grants != 3 || r.OrphansSeen != 1 {
		t.Fatalf("clean history: %+v", r)
	}
	cases := map[string]struct {
		add  []Event
		want func(GenReport) int
	}{
		"fence regression": {[]Event{
			{T: 10600 * ms, Kind: AcquireInvoke, Op: 4, Key: "k"},
			{T: 10700 * ms, Kind: AcquireOK, Op: 4, Key: "k", Fence: 3, Owner: "d"},
		}, func(r GenReport) int { return r.FenceRegressions }},
		"live past validity": {[]Event{
			{T: 10600 * ms, Kind: LivePastValidity, Key: "k", Fence: 2, Value: int64(time.Second)},
		}, func(r GenReport) int { return r.LivePastValidity }},
		"orphan past its TTL": {[]Event{
			{T: 11000 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 4, Owner: "y"},
			{T: 17500 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 4, Owner: "y"},
		}, func(r GenReport) int { return r.Orphans }},
		"slow orphan": {[]Event{
			{T: 10980 * ms, Kind: AcquireInvoke, Worker: 1, Op: 9, Name: "cancel", Key: "k"},
			{T: 10990 * ms, Kind: AcquireFail, Worker: 1, Op: 9, Name: "cancel", Key: "k"},
			{T: 11000 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 4, Owner: "y"},
			{T: 14000 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 4, Owner: "y"},
		}, func(r GenReport) int { return r.SlowOrphans }},
		"set returned with a superseded member": {[]Event{
			{T: 10000 * ms, Kind: AcquireInvoke, Op: 5, Name: "all", Key: "m"},
			{T: 10100 * ms, Kind: AcquireOK, Op: 6, Key: "m", Fence: 9, Owner: "e"},
			{T: 11000 * ms, Kind: SetMember, Op: 5, Name: "all", Key: "m", Fence: 8, Owner: "f", Value: 1},
		}, func(r GenReport) int { return r.SetsHealthyWithLost }},
		"set healthy with an ended lease": {[]Event{
			{T: 10600 * ms, Kind: SetHealthyLost, Key: "k", Fence: 2},
		}, func(r GenReport) int { return r.SetsHealthyWithLost }},
		"lease outlived a break": {[]Event{
			{T: 10000 * ms, Kind: AcquireOK, Worker: 2, Key: "b", Fence: 1, Owner: "p", TTL: time.Second},
			{T: 10100 * ms, Kind: BreakInvoke, Worker: 1, Op: 20, Key: "b"},
			{T: 10110 * ms, Kind: BreakDone, Worker: 1, Op: 20, Key: "b", Fence: 1, Owner: "p"},
			{T: 11500 * ms, Kind: Lost, Worker: 2, Key: "b", Fence: 1},
		}, func(r GenReport) int { return r.OutlivedBreak }},
		"renewed after a break": {[]Event{
			{T: 10600 * ms, Kind: RenewedAfterBreak, Worker: 2, Key: "b", Fence: 1, Value: int64(300 * time.Millisecond)},
		}, func(r GenReport) int { return r.RenewedAfterBreak }},
		"two owners at once": {[]Event{
			{T: 10000 * ms, Kind: AcquireOK, Worker: 2, Key: "o", Fence: 1, Owner: "p", TTL: time.Second},
			{T: 10100 * ms, Kind: AcquireOK, Worker: 3, Key: "o", Fence: 2, Owner: "q", TTL: time.Second},
			{T: 11000 * ms, Kind: ReleaseInvoke, Worker: 2, Key: "o", Fence: 1, Owner: "p"},
		}, func(r GenReport) int { return r.Overlaps }},
	}
	for name, c := range cases {
		evs := append(append([]Event(nil), clean...), c.add...)
		r := CheckGen(evs, fenced.FenceStrict, ttl, bound)
		if c.want(r) != 1 || !r.Failed() {
			t.Errorf("%s: %+v; want it counted once", name, r)
		}
	}
	// A slow orphan while a fault is active is not counted.
	evs := append(append([]Event(nil), clean...),
		Event{T: 10900 * ms, Kind: FaultStart, Worker: 1, Fault: string(CutHolder)},
		Event{T: 10980 * ms, Kind: AcquireInvoke, Worker: 1, Op: 9, Name: "cancel", Key: "k"},
		Event{T: 10990 * ms, Kind: AcquireFail, Worker: 1, Op: 9, Name: "cancel", Key: "k"},
		Event{T: 11000 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 4, Owner: "y"},
		Event{T: 14000 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 4, Owner: "y"},
		Event{T: 14100 * ms, Kind: FaultEnd, Worker: 1, Fault: string(CutHolder)})
	if r := CheckGen(evs, fenced.FenceStrict, ttl, bound); r.Failed() {
		t.Errorf("slow orphan during a partition: %+v; want no violation", r)
	}
	// Nor is a grant an AcquireAll holds while it waits for its next key.
	evs = append(append([]Event(nil), clean...),
		Event{T: 10900 * ms, Kind: AcquireInvoke, Worker: 2, Op: 10, Name: "all", Key: "k"},
		Event{T: 10900 * ms, Kind: AcquireInvoke, Worker: 2, Op: 10, Name: "all", Key: "q"},
		Event{T: 10990 * ms, Kind: AcquireFail, Worker: 0, Op: 11, Name: "cancel", Key: "k"},
		Event{T: 11000 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 4, Owner: "y"},
		Event{T: 13500 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 4, Owner: "y"},
		Event{T: 13600 * ms, Kind: AcquireFail, Worker: 2, Op: 10, Name: "all"})
	if r := CheckGen(evs, fenced.FenceStrict, ttl, bound); r.Failed() {
		t.Errorf("a grant held by a waiting AcquireAll: %+v; want no violation", r)
	}
	// The hard limit counts from the end of the acquisition that may have
	// made the grant and was running when it was first seen (a set waits
	// for its other keys up to its MaxWait; a single-key acquisition
	// learns of a grant applied while the authority was unreachable only
	// once it is back): held 7 s, 1.5 s of it after the acquisition
	// failed, is no orphan; 6.5 s after is one.
	acqWait := func(lastSeen, failed int64, name string, faults ...Event) []Event {
		return append(append(append([]Event(nil), clean...),
			Event{T: 10900 * ms, Kind: AcquireInvoke, Worker: 2, Op: 10, Name: name, Key: "k"},
			Event{T: 11000 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 4, Owner: "y"},
			Event{T: failed, Kind: AcquireFail, Worker: 2, Op: 10, Name: name},
			Event{T: lastSeen, Kind: Observed, Worker: -1, Key: "k", Fence: 4, Owner: "y"}), faults...)
	}
	for _, name := range []string{"all", "acquire"} {
		if r := CheckGen(acqWait(18000*ms, 16500*ms, name, Event{T: 11500 * ms, Kind: FaultStart, Worker: -1, Fault: string(CrashAuthority)}, Event{T: 11600 * ms, Kind: FaultEnd, Worker: -1, Fault: string(CrashAuthority)}), fenced.FenceStrict, ttl, bound); r.Failed() {
			t.Errorf("%s: a grant held while its acquisition waited out a crash: %+v; want no violation", name, r)
		}
		if r := CheckGen(acqWait(23000*ms, 16500*ms, name), fenced.FenceStrict, ttl, bound); r.Orphans != 1 {
			t.Errorf("%s: a grant held 6.5 s after its acquisition failed: %+v; want an orphan", name, r)
		}
	}
	// Nor while the authority could not answer: a grant that stood 9 s, 5 s
	// of it while the authority was down and 3 s after it answered again,
	// is no orphan; the same without the fault is one.
	down := []Event{
		{T: 11000 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 4, Owner: "y"},
		{T: 12000 * ms, Kind: FaultStart, Worker: -1, Fault: string(CrashAuthority)},
		{T: 17000 * ms, Kind: FaultEnd, Worker: -1, Fault: string(CrashAuthority)},
		{T: 20000 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 4, Owner: "y"},
	}
	if r := CheckGen(append(append([]Event(nil), clean...), down...), fenced.FenceStrict, ttl, bound); r.Orphans != 0 {
		t.Errorf("a grant held across an outage of the authority: %+v; want no orphan", r)
	}
	if r := CheckGen(append(append([]Event(nil), clean...), down[0], down[3]), fenced.FenceStrict, ttl, bound); r.Orphans != 1 {
		t.Errorf("a grant held 9 s with the authority up: %+v; want an orphan", r)
	}
	// A queued waiter that missed its turn: its grant stood 5.5 s (past
	// the TTL, 5 s) while its Acquire went on waiting, with no fault, and
	// went as it gave up.
	if r := CheckGen(acqWait(16600*ms, 16500*ms, "acquire"), fenced.FenceStrict, ttl, bound); r.SlowOrphans != 1 {
		t.Errorf("a waiter's grant standing while its Acquire waits on: %+v; want it counted", r)
	}
	// Not if a set (which holds what it got) or if a fault was active.
	if r := CheckGen(acqWait(16600*ms, 16500*ms, "all"), fenced.FenceStrict, ttl, bound); r.Failed() {
		t.Errorf("a member held while its set waited: %+v; want no violation", r)
	}
	if r := CheckGen(acqWait(16600*ms, 16500*ms, "acquire", Event{T: 12000 * ms, Kind: FaultStart, Worker: 2, Fault: string(CutHolder)}, Event{T: 14000 * ms, Kind: FaultEnd, Worker: 2, Fault: string(CutHolder)}), fenced.FenceStrict, ttl, bound); r.Failed() {
		t.Errorf("a waiter's grant standing while its worker was cut off: %+v; want no violation", r)
	}
	// A grant's life is measured from the listings that saw it: from the
	// first one's answer to the last one's request. A slow last listing
	// (answered 1.5 s after it was sent) does not stretch a grant that
	// lived its TTL into an orphan; the same grant still seen by a listing
	// sent 6.5 s after the first answer is one.
	slowListing := []Event{
		{T: 11000 * ms, Asked: 10990 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 4, Owner: "y"},
		{T: 17500 * ms, Asked: 16000 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 4, Owner: "y"},
	}
	if r := CheckGen(append(append([]Event(nil), clean...), slowListing...), fenced.FenceStrict, ttl, bound); r.Orphans != 0 {
		t.Errorf("an orphan seen by a slow listing: %+v; want it not past its TTL", r)
	}
	slowListing[1].Asked = 17500*ms - 1
	if r := CheckGen(append(append([]Event(nil), clean...), slowListing...), fenced.FenceStrict, ttl, bound); r.Orphans != 1 {
		t.Errorf("an orphan seen 6.5 s after it was first seen: %+v; want it counted", r)
	}
	// Two grants to one owner (an acquisition that asked again after its
	// first grant lapsed) are two lives, not one.
	regranted := []Event{
		{T: 11000 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 4, Owner: "y"},
		{T: 12000 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 4, Owner: "y"},
		{T: 16500 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 9, Owner: "y"},
		{T: 17500 * ms, Kind: Observed, Worker: -1, Key: "k", Fence: 9, Owner: "y"},
	}
	if r := CheckGen(append(append([]Event(nil), clean...), regranted...), fenced.FenceStrict, ttl, bound); r.Orphans != 0 || r.OrphansSeen != 3 {
		t.Errorf("one owner granted twice: %+v; want two orphans seen, neither past its TTL", r)
	}
	// Two owners at once are excused by a break of the first, by its
	// worker being stopped, and on a repeatable fence by a restart of the
	// authority; a lease that ends within its TTL of a break is fine.
	overlap := []Event{
		{T: 10000 * ms, Kind: AcquireOK, Worker: 2, Key: "o", Fence: 1, Owner: "p", TTL: time.Second},
		{T: 10100 * ms, Kind: AcquireOK, Worker: 3, Key: "o", Fence: 2, Owner: "q", TTL: time.Second},
		{T: 11000 * ms, Kind: Lost, Worker: 2, Key: "o", Fence: 1},
	}
	for name, c := range map[string]struct {
		add      []Event
		strength fenced.FenceStrength
	}{
		"break": {[]Event{
			{T: 10050 * ms, Kind: BreakInvoke, Op: 30, Key: "o"},
			{T: 10060 * ms, Kind: BreakDone, Op: 30, Key: "o", Fence: 1},
		}, fenced.FenceStrict},
		"stopped": {[]Event{
			{T: 10020 * ms, Kind: FaultStart, Worker: 2, Fault: string(PauseHolder)},
			{T: 10900 * ms, Kind: FaultEnd, Worker: 2, Fault: string(PauseHolder)},
		}, fenced.FenceStrict},
		"restarted": {[]Event{
			{T: 10020 * ms, Kind: FaultStart, Worker: -1, Fault: string(CrashAuthority)},
			{T: 10030 * ms, Kind: FaultEnd, Worker: -1, Fault: string(CrashAuthority)},
		}, fenced.FenceRepeatable},
	} {
		evs := append(append(append([]Event(nil), clean...), overlap...), c.add...)
		if r := CheckGen(evs, c.strength, ttl, bound); r.Failed() {
			t.Errorf("two owners excused by a %s: %+v; want no violation", name, r)
		}
	}
	// A set member is recorded only once AcquireAll returns, which may be
	// after a break of that very grant (an operator broke the key it took
	// first while it waited for the next): the break excuses the next
	// owner (worker 2 on seed 1796512162091729172, fence 63 broken 103 ms
	// before its set was recorded, fence 64 granted 206 ms after); a break
	// of an earlier grant of the key, done before the member was recorded,
	// does not.
	brokenMember := func(fence uint64, owner string) []Event {
		return []Event{
			{T: 9900 * ms, Kind: BreakInvoke, Op: 31, Key: "o"},
			{T: 9950 * ms, Kind: BreakDone, Op: 31, Key: "o", Fence: fence, Owner: owner},
			{T: 10000 * ms, Kind: SetMember, Worker: 2, Op: 32, Name: "all", Key: "o", Fence: 1, Owner: "p", Value: 1, TTL: time.Second},
			{T: 10100 * ms, Kind: AcquireOK, Worker: 3, Key: "o", Fence: 2, Owner: "q", TTL: time.Second},
			{T: 11000 * ms, Kind: Lost, Worker: 2, Key: "o", Fence: 1},
		}
	}
	if r := CheckGen(append(append([]Event(nil), clean...), brokenMember(1, "p")...), fenced.FenceStrict, ttl, bound); r.Failed() {
		t.Errorf("two owners after a break of the first's grant, recorded before it: %+v; want no violation", r)
	}
	if r := CheckGen(append(append([]Event(nil), clean...), brokenMember(1, "z")...), fenced.FenceStrict, ttl, bound); r.Overlaps != 1 {
		t.Errorf("two owners after a break of another grant, recorded before the first: %+v; want it counted", r)
	}
	// A set member superseded because its grant was broken: the break
	// that completed after AcquireAll began to confirm it (its last key's
	// grant, at 10 s) could not be seen, however long the set took to come
	// back on a starved worker (fences 119 and 120 granted 0.6 and 0.3 s
	// before its health was read); nor could any break of the last key
	// (Confirmed 0), granted last. A break that completed before the
	// confirmation began must have failed it.
	supersededMember := func(broken, confirmed int64) []Event {
		return []Event{
			{T: 9000 * ms, Kind: AcquireInvoke, Worker: 1, Op: 40, Name: "all", Key: "s"},
			{T: broken - 20*ms, Kind: BreakInvoke, Worker: 2, Op: 41, Key: "s"},
			{T: broken, Kind: BreakDone, Worker: 2, Op: 41, Key: "s", Fence: 118, Owner: "m"},
			{T: 10400 * ms, Kind: AcquireOK, Worker: 0, Op: 42, Key: "s", Fence: 119, Owner: "n"},
			{T: 10500 * ms, Kind: ReleaseInvoke, Worker: 0, Key: "s", Fence: 119, Owner: "n"},
			{T: 10700 * ms, Kind: AcquireOK, Worker: 2, Op: 43, Key: "s", Fence: 120, Owner: "o"},
			{T: 11000 * ms, Kind: SetMember, Worker: 1, Op: 40, Name: "all", Key: "s", Fence: 118, Owner: "m", Value: 1, Confirmed: confirmed},
			{T: 11100 * ms, Kind: Lost, Worker: 1, Key: "s", Fence: 118},
		}
	}
	for name, c := range map[string]struct {
		broken, confirmed int64
		want              int
	}{
		"broken after its confirmation began":  {10100 * ms, 10000 * ms, 0},
		"the last key, broken":                 {9900 * ms, 0, 0},
		"broken before its confirmation began": {9900 * ms, 10000 * ms, 1},
	} {
		r := CheckGen(append(append([]Event(nil), clean...), supersededMember(c.broken, c.confirmed)...), fenced.FenceStrict, ttl, bound)
		if r.SetsHealthyWithLost != c.want || r.Failed() != (c.want > 0) {
			t.Errorf("a set member superseded, %s: %+v; want %d sets healthy with a lost member", name, r, c.want)
		}
	}
	evs = append(append([]Event(nil), clean...), overlap...)
	evs = append(evs, Event{T: 10020 * ms, Kind: FaultStart, Worker: -1, Fault: string(CrashAuthority)}, Event{T: 10030 * ms, Kind: FaultEnd, Worker: -1, Fault: string(CrashAuthority)})
	if r := CheckGen(evs, fenced.FenceStrict, ttl, bound); r.Overlaps != 1 {
		t.Errorf("two owners across a restart of a durable authority: %+v; want it counted", r)
	}
}

// TestUpdateGenSection rewrites the generative section in place and keeps
// the rest of the report.
func TestUpdateGenSection(t *testing.T) {
	dir := t.TempDir()
	md, rows := dir+"/proof.md", dir+"/generative.json"
	if err := os.WriteFile(md, []byte("# Proof matrix\n\nrows\n\n## Timelines\n\nsvg\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, ops := range []int{1200, 3400} {
		if err := SaveGenRow(rows, GenRow{Build: "main", Backend: "sqlite", Mode: "slice", Duration: time.Minute, Report: GenReport{Seed: 7, Ops: ops, ByOp: map[string]int{"hold": ops}}}); err != nil {
			t.Fatal(err)
		}
		if err := UpdateGenSection(md, rows); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if strings.Count(s, genBegin) != 1 || !strings.Contains(s, "| 3400 |") || strings.Contains(s, "| 1200 |") ||
		!strings.HasPrefix(s, "# Proof matrix\n\nrows\n\n"+genBegin) || !strings.HasSuffix(s, genEnd+"\n\n## Timelines\n\nsvg\n") {
		t.Fatalf("report after two updates:\n%s", s)
	}
}
