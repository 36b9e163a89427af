package proof

import (
	"fmt"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// The model checked with porcupine is the guarded ledger as the lease and
// the fence promise it: an append log per key whose head records the
// newest fence (and its owner) the resource accepted, where
//
//   - a claim or a write is accepted if and only if its fence is higher
//     than the recorded one, or equal with the same owner;
//   - an accepted write extends the log the writer read: it appends entry
//     prev+1 where prev is the length the writer read under its lease (no
//     lost update), and
//   - a read returns the current length.
//
// The model ignores whether the run's resource checks fences: with fencing
// off, a stale write the resource accepts is a violation, which is how the
// checker sees the hazard. Operations whose outcome the worker never
// learnt (it was killed, or its write was delayed past its patience) take
// their outcome from the resource (the ledger and claims tables name every
// accepted op) and stay open until the end of the history.

type ledgerState struct {
	length int64
	fence  uint64
	owner  string
}

type opKind int

const (
	opRead opKind = iota
	opClaim
	opWrite
)

type ledgerInput struct {
	kind  opKind
	key   string
	fence uint64
	owner string
	prev  int64
}

type ledgerOutput struct {
	applied bool
	// known is false when the outcome came from the resource after the
	// worker lost track of it: a refusal is then "not applied", for any
	// reason, and a claim's length is unknown.
	known  bool
	length int64
}

func (s ledgerState) admits(in ledgerInput) bool {
	return in.fence > s.fence || (in.fence == s.fence && in.owner == s.owner)
}

var ledgerModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(ledgerInput).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		sort.Strings(keys)
		var out [][]porcupine.Operation
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return ledgerState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(ledgerState), input.(ledgerInput), output.(ledgerOutput)
		switch in.kind {
		case opRead:
			return out.length == s.length, s
		case opClaim:
			if !out.applied {
				return !out.known || !s.admits(in), s
			}
			if !s.admits(in) || (out.known && out.length != s.length) {
				return false, s
			}
			return true, ledgerState{length: s.length, fence: in.fence, owner: in.owner}
		default: // opWrite
			if !out.applied {
				return !out.known || !s.admits(in), s
			}
			if !s.admits(in) || in.prev != s.length {
				return false, s
			}
			return true, ledgerState{length: in.prev + 1, fence: in.fence, owner: in.owner}
		}
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(ledgerInput), output.(ledgerOutput)
		verdict := "refused"
		if out.applied {
			verdict = "accepted"
		}
		switch in.kind {
		case opRead:
			return fmt.Sprintf("read → %d", out.length)
		case opClaim:
			return fmt.Sprintf("claim f=%d → %s len=%d", in.fence, verdict, out.length)
		}
		return fmt.Sprintf("append %d f=%d → %s", in.prev+1, in.fence, verdict)
	},
	DescribeState: func(state any) string {
		s := state.(ledgerState)
		return fmt.Sprintf("len=%d f=%d", s.length, s.fence)
	},
}

// ledgerOpen is an invocation of the ledger waiting for its completion.
type ledgerOpen struct {
	e    Event
	kind opKind
}

// unfinished returns the operations of invocations never completed (the
// worker was killed or stopped for good): a write or claim may have taken
// effect, so each stays open until end.
func unfinished(opens map[int64]ledgerOpen, done, applied map[int64]bool, res Contents, end int64) []porcupine.Operation {
	var ops []porcupine.Operation
	for op, o := range opens {
		if done[op] {
			continue
		}
		in := ledgerInput{kind: o.kind, key: o.e.Key, fence: o.e.Fence, owner: o.e.Owner, prev: o.e.Prev}
		switch {
		case o.kind == opWrite:
			ops = append(ops,
				porcupine.Operation{ClientId: o.e.Worker, Input: in, Call: o.e.T, Output: ledgerOutput{applied: applied[op]}, Return: end})
		default:
			if _, claimed := res.Claims[op]; claimed {
				in.kind = opClaim
				ops = append(ops,
					porcupine.Operation{ClientId: o.e.Worker, Input: in, Call: o.e.T, Output: ledgerOutput{applied: true}, Return: end})
			}
		}
	}
	return ops
}

// checkLedger builds the porcupine history of the ledger and checks it. It
// returns porcupine's verdict and any events it could not pair.
func checkLedger(events []Event, res Contents, end int64) (string, []string) {
	applied := map[int64]bool{}
	for _, l := range res.Ledger {
		applied[l.Op] = true
	}
	opens := map[int64]ledgerOpen{}
	done := map[int64]bool{}
	var ops []porcupine.Operation
	var problems []string
	for _, e := range events {
		switch e.Kind {
		case ReadInvoke:
			opens[e.Op] = ledgerOpen{e, opRead}
		case WriteInvoke:
			opens[e.Op] = ledgerOpen{e, opWrite}
		case ReadOK, ReadRefused, ReadFail, WriteOK, WriteRefused, WriteFail:
		case FaultEnd:
			if e.Fault != string(DelayWrite) || e.Op == 0 {
				continue
			}
		default:
			continue
		}
		if e.Kind == ReadInvoke || e.Kind == WriteInvoke {
			continue
		}
		o, ok := opens[e.Op]
		if !ok {
			if e.Kind != FaultEnd {
				problems = append(problems, fmt.Sprintf("completion %s op %d without invocation", e.Kind, e.Op))
			}
			continue
		}
		if done[e.Op] && e.Kind != FaultEnd {
			continue
		}
		in := ledgerInput{kind: o.kind, key: o.e.Key, fence: o.e.Fence, owner: o.e.Owner, prev: o.e.Prev}
		var out ledgerOutput
		ret := e.T
		switch e.Kind {
		case ReadOK:
			out = ledgerOutput{applied: true, known: true, length: e.Value}
			if _, claimed := res.Claims[e.Op]; claimed {
				in.kind = opClaim
			}
		case ReadRefused:
			in.kind = opClaim
			out = ledgerOutput{known: true}
		case ReadFail:
			if _, claimed := res.Claims[e.Op]; !claimed {
				done[e.Op] = true
				continue // a failed plain read or refused claim changed nothing
			}
			in.kind, out, ret = opClaim, ledgerOutput{applied: true}, end
		case WriteOK, WriteRefused:
			out = ledgerOutput{applied: e.Kind == WriteOK, known: true}
		case WriteFail:
			// The M2 write's real landing is recorded later as FaultEnd;
			// until then, leave it open.
			if !done[e.Op] {
				out, ret = ledgerOutput{applied: applied[e.Op]}, end
			}
		case FaultEnd:
			// A delayed write landed: replace the open-ended entry.
			for i := range ops {
				if ops[i].Input.(ledgerInput) == in && ops[i].ClientId == o.e.Worker && ops[i].Call == o.e.T {
					ops[i].Return = e.T
					ops[i].Output = ledgerOutput{applied: applied[e.Op], known: true}
				}
			}
			continue
		}
		done[e.Op] = true
		ops = append(ops, porcupine.Operation{ClientId: o.e.Worker, Input: in, Call: o.e.T, Output: out, Return: ret})
	}
	ops = append(ops, unfinished(opens, done, applied, res, end)...)
	verdict := porcupine.CheckOperationsTimeout(ledgerModel, ops, time.Minute)
	return string(verdict), problems
}
