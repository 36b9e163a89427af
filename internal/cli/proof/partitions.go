package proof

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// PartitionsResult is one backend's result of the multi-process proof of
// recipe.Partitions (recipe's TestPartitionsProof*), as written to
// docs/proof/partitions-BACKEND.json by scripts/proof.sh and shown in
// docs/proof.md.
type PartitionsResult struct {
	Backend    string `json:"backend"`
	Churn      string `json:"churn"`
	Members    int    `json:"members"`
	Partitions int    `json:"partitions"`
	TTL        string `json:"ttl"`
	// Faults counts the nemesis's faults by kind: kill (-9, then a
	// restart), stop (SIGSTOP past the TTL), leave (SIGTERM, then a
	// restart).
	Faults map[string]int `json:"faults"`
	// WritesAccepted and StaleAccepted count the resource's accepted
	// writes, and those whose fence was below one it had accepted before.
	WritesAccepted int `json:"writes_accepted"`
	StaleAccepted  int `json:"stale_accepted"`
	// StaleRefused counts writes the guard refused as stale.
	StaleRefused int `json:"stale_refused"`
	// Overlaps counts grants of a partition while another process still
	// believed it owned it (a stopped or killed one).
	Overlaps int `json:"overlaps"`
	// Recovery is the longest time from a kill to the new grant of a
	// partition the killed member owned.
	Recovery string `json:"recovery_after_kill"`
	// LongestGap is the longest time a partition went without an
	// accepted write.
	LongestGap string `json:"longest_gap"`
	// BalancedAfter is how long after the churn a look found every member
	// owning ⌊P/N⌋ or ⌈P/N⌉ partitions (the first look comes once the
	// recovery bound has passed); Owned what each owned then.
	BalancedAfter string `json:"balanced_after"`
	Owned         []int  `json:"owned"`
	HandOffs      int    `json:"handoffs"`
	// Checkpoints counts the partitions' checkpoints (CheckCheckpoints):
	// accepted and refused tries, ownerships started from one, stale ones
	// accepted and breaks of continuity (both must be 0).
	Checkpoints CheckpointCounts `json:"checkpoints"`
	Passed      bool             `json:"passed"`
}

// partitionsBackends are the backends of the partitions proof, in the
// order docs/proof.md shows them.
var partitionsBackends = []string{"sqlite", "postgres", "redis", "etcd"}

// WritePartitions writes the "Partitioned ownership" section of
// docs/proof.md from the partitions-BACKEND.json files in dir.
func WritePartitions(md io.Writer, dir string) error {
	fmt.Fprint(md, "\n## Partitioned ownership (recipe.Partitions)\n\n"+
		"Member processes (5) of one group of 64 partitions, 1 s leases; a nemesis kills them (-9) and restarts them, stops them\n"+
		"(SIGSTOP) for 1.5 to 2.5 TTLs, makes them leave (SIGTERM) and restarts them, one fault at a time at random. Every owned\n"+
		"partition's work appends to a SQLite table guarded by fence.SQL, with an append log in the same transaction (the log's order\n"+
		"is the resource's). *Stale accepted* counts log entries whose fence is below one accepted before for that partition; *overlaps*\n"+
		"counts grants of a partition while another process still believed it owned it (a stopped one, or a killed one, which never\n"+
		"logs a release); *owned again after a kill* is the longest time from a kill -9 to the new grant of a partition the killed\n"+
		"member owned (bounded by the test at how long the store keeps a dead grant + a TTL + a poll + 1.5 s: 3.8 s, on etcd 5.3 s); "+
		"*longest gap* is the longest time a partition went without an accepted write; *balanced after* is when a look\n"+
		"found every member owning 12 or 13: the test looks first once the recovery bound has passed after the churn, so\n"+
		"3.8 s (etcd 5.3 s) means balanced at the first look. Gaps are long because a member stopped inside a transaction holds the "+
		"SQLite\n"+
		"resource's write lock (and, on SQLite, the lease store's) for the whole stop, stalling every member: an availability hazard\n"+
		"of one shared SQLite file, which the fence keeps safe. Run by `PARTITIONS_PROOF_FOR=3m PARTITIONS_PROOF_OUT=docs/proof go test "+
		"-run 'TestPartitionsProof' ./recipe/`\n"+
		"(scripts/proof.sh).\n"+
		"*Checkpoints*: every 4th write, and once more after its context ended, the work records \"fence:seq\" as the partition's\n"+
		"checkpoint (fenced.Lease.Checkpoint); accepted / refused counts the tries, *from one* the ownerships that started from a\n"+
		"checkpoint (recipe.Partition.Checkpoint), *stale cp* the checkpoints accepted under a fence after a later grant's work had\n"+
		"started, and *breaks* the ownerships that did not start from the last checkpoint accepted before them (both must be 0).\n\n")
	fmt.Fprintln(md,
		"| backend | churn | faults (kill / stop / leave) | writes accepted | stale accepted | stale refused | overlaps | owned again "+
			"after a kill | longest gap | balanced after | owned at the end | hand-offs | checkpoints accepted / refused | from one "+
			"| stale cp | breaks | passed |")
	fmt.Fprintln(md, "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |")
	for _, b := range partitionsBackends {
		raw, err := os.ReadFile(filepath.Join(dir, "partitions-"+b+".json"))
		if errors.Is(err, fs.ErrNotExist) {
			fmt.Fprintf(md, "| %s | not run yet (run scripts/proof.sh) ||||||||||||||||\n", b)
			continue
		}
		if err != nil {
			return err
		}
		var r PartitionsResult
		if err := json.Unmarshal(raw, &r); err != nil {
			return fmt.Errorf("%s: %w", b, err)
		}
		cp := r.Checkpoints
		fmt.Fprintf(md, "| %s | %s | %d / %d / %d | %d | %d | %d | %d | %s | %s | %s | %v | %d | %d / %d | %d | %d | %d | %v |\n",
			r.Backend, r.Churn, r.Faults["kill"], r.Faults["stop"], r.Faults["leave"], r.WritesAccepted, r.StaleAccepted, r.StaleRefused,
			r.Overlaps, r.Recovery, r.LongestGap, r.BalancedAfter, r.Owned, r.HandOffs, cp.Accepted, cp.Refused, cp.Starts, cp.Stale,
			cp.Breaks, r.Passed)
	}
	return nil
}
