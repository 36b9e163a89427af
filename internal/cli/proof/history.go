package proof

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Kind names what an Event records.
type Kind string

// Event kinds. Invocations and completions of the same operation share an
// Op number, unique within a history.
const (
	// AcquireInvoke is the call to Acquire; AcquireOK (with the fence and
	// the owner digest) or AcquireFail completes it.
	AcquireInvoke Kind = "acquire"
	AcquireOK     Kind = "acquired"
	AcquireFail   Kind = "acquire_failed"
	// Renewed and RenewFail record automatic renewals.
	Renewed   Kind = "renewed"
	RenewFail Kind = "renew_failed"
	// Lost says the worker learnt that its lease ended (the authority said
	// so, or local validity ran out). The worker believed it held the key
	// from AcquireOK until Lost or ReleaseInvoke.
	Lost Kind = "lost"
	// ReleaseInvoke and ReleaseDone bracket a release.
	ReleaseInvoke Kind = "release"
	ReleaseDone   Kind = "released"
	// ReadInvoke starts the read of the protected state (with the claim, in
	// the claim-first ordering). ReadOK carries the ledger length read
	// (Value). ReadRefused says the claim was refused as stale (Current is
	// the resource's fence). ReadFail says the outcome is unknown.
	ReadInvoke  Kind = "read"
	ReadOK      Kind = "read_ok"
	ReadRefused Kind = "read_refused"
	ReadFail    Kind = "read_failed"
	// Abandon says the worker found its lease lost before writing and did
	// not write.
	Abandon Kind = "abandon"
	// WriteInvoke is a guarded append of entry Value (Prev is the length
	// the writer read). WriteOK: accepted; WriteRefused: refused as stale
	// (Current is the resource's fence); WriteFail: outcome unknown to the
	// worker (resolved from the resource by the checker).
	WriteInvoke  Kind = "write"
	WriteOK      Kind = "write_ok"
	WriteRefused Kind = "write_refused"
	WriteFail    Kind = "write_failed"
	// FaultStart and FaultEnd bracket a fault the nemesis injected (Fault
	// names it; Worker is the worker it hit, or -1 for the authority).
	FaultStart Kind = "fault_start"
	FaultEnd   Kind = "fault_end"
	// Held marks a worker the nemesis holds back (M13: the new holder,
	// between its read and its write) until the stale write has landed.
	Held Kind = "held"
	// WorkerStart and WorkerExit bracket a worker process's life; a worker
	// killed by the nemesis has a FaultStart with Fault "M3" instead of an
	// exit.
	WorkerStart Kind = "worker_start"
	WorkerExit  Kind = "worker_exit"
)

// Event is one line of a history: a JSON object with the host's monotonic
// time. All processes of a run are on one host, so their times compare.
type Event struct {
	// T is CLOCK_MONOTONIC in nanoseconds (see Now).
	T int64 `json:"t"`
	// Worker is the worker's number (0..W-1; a restarted worker keeps its
	// number), -1 for the nemesis.
	Worker int `json:"w"`
	// PID is the process that recorded the event.
	PID  int  `json:"pid,omitempty"`
	Kind Kind `json:"k"`
	// Op links an invocation to its completion.
	Op    int64  `json:"op,omitempty"`
	Key   string `json:"key,omitempty"`
	Fence uint64 `json:"f,omitempty"`
	// Owner is the grant's owner digest (fence.OwnerDigest), never the
	// owner token.
	Owner string `json:"o,omitempty"`
	// Value is the ledger length read (ReadOK) or the entry written
	// (WriteInvoke: Prev+1).
	Value int64 `json:"v,omitempty"`
	// Prev is the ledger length the writer read before writing.
	Prev int64 `json:"prev,omitempty"`
	// Current is the resource's fence when it refused.
	Current uint64 `json:"cur,omitempty"`
	Fault   string `json:"fault,omitempty"`
	// Name is the operation of a generative run (see RunGen).
	Name string `json:"n,omitempty"`
	// TTL is a granted lease's TTL (AcquireOK and SetMember of a
	// generative run).
	TTL time.Duration `json:"ttl,omitempty"`
	// Asked is when the listing an Observed event comes from was sent
	// (CLOCK_MONOTONIC, as T): the holder was seen at some instant between
	// Asked and T. 0 when unknown (then T alone).
	Asked int64 `json:"asked,omitempty"`
	// Confirmed is, for a SetMember confirmed by a renewal (any but the
	// set's last key), when AcquireAll had its last key granted
	// (CLOCK_MONOTONIC, as T): it renewed this member after that. 0 for
	// the last key, whose grant is its confirmation.
	Confirmed int64  `json:"confirmed,omitempty"`
	Err       string `json:"err,omitempty"`
}

// Now returns the host's CLOCK_MONOTONIC in nanoseconds. It is comparable
// between processes on one host, unlike Go's monotonic readings, which are
// private to a process. It is never stepped.
func Now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("proof: clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return ts.Nano()
}

// Recorder appends events to a history file shared by every process of a
// run. Each event is one write(2) of one line on a file opened with
// O_APPEND, so lines from different processes never interleave. It is safe
// for concurrent use.
type Recorder struct {
	mu     sync.Mutex
	f      *os.File
	worker int
	pid    int
}

// OpenRecorder opens (creating it if needed) the history file at path for
// appending, recording events as worker (-1 for the nemesis).
func OpenRecorder(path string, worker int) (*Recorder, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("proof: open history: %w", err)
	}
	return &Recorder{f: f, worker: worker, pid: os.Getpid()}, nil
}

// Record stamps e with the time (unless T is set) and the process, and
// appends it. A worker's recorder also stamps the worker; the nemesis's
// recorder keeps e.Worker. Errors are returned, never ignored: a history
// with holes is not evidence.
func (r *Recorder) Record(e Event) error {
	if e.T == 0 {
		e.T = Now()
	}
	if r.worker >= 0 {
		e.Worker = r.worker
	}
	e.PID = r.pid
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.f.Write(b); err != nil {
		return fmt.Errorf("proof: record: %w", err)
	}
	return nil
}

// Close closes the file.
func (r *Recorder) Close() error { return r.f.Close() }

// ReadHistory reads every event of a history file, in file order (which is
// not quite time order across processes; sort by T where it matters). A
// torn last line (a writer killed mid-write cannot tear a line, but a full
// disk can) is an error.
func ReadHistory(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("proof: read history: %w", err)
	}
	defer f.Close()
	var evs []Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("proof: history %s line %d: %w", path, n, err)
		}
		evs = append(evs, e)
	}
	return evs, sc.Err()
}
