package proof

import (
	"fmt"
	"os/exec"
	"syscall"
	"time"
)

// PartitionMinority (report id P1) partitions a 3-member consensus ensemble
// (etcd or ZooKeeper) into a minority and a majority. A holder is on the
// minority side (Hazelcast 3.8.3's finding). Each worker runs on the host
// of one member (Config.Partition places it). A holder is held before its
// write, and its host is cut off, member and all. The majority expires the
// holder's lease and grants the key again. The partition heals once another
// worker has written (or after 16 TTLs). The holder, let go, writes with
// its old fence. Checked: its lease ended (its context was cancelled)
// before the majority's next grant, and the fence refuses its write.
const PartitionMinority Fault = "P1"

// heldFor is how long holdAcross waits for another worker's write while a
// holder is held: 8 TTLs, and 16 for P1, where the majority may first have
// to elect a leader (etcd's new leader also extends every lease by an
// election timeout) before it expires the holder's lease.
func heldFor(f Fault, ttl time.Duration) time.Duration {
	if f == PartitionMinority {
		return 16 * ttl
	}
	return 8 * ttl
}

// Partition puts each worker process on a host of a private network. The
// nemesis cuts its links at the packet level, instead of through the
// per-worker TCP proxies (M4, M9, M11; P1 needs one). The store is then on
// that network too, out of the controller's reach: set Config.Declared.
type Partition interface {
	// Place makes cmd, worker w's process, run on w's host.
	Place(w int, cmd *exec.Cmd)
	// Cut drops every packet to and from w's host; Heal undoes it.
	Cut(w int) error
	Heal(w int) error
	// Lose drops percent of the packets to and from w's host, each at
	// random; Lose(w, 0) ends it.
	Lose(w, percent int) error
	// TxPackets returns how many packets w's host has sent, read through
	// pid, a process running on it.
	TxPackets(w, pid int) (uint64, error)
}

// cutOff cuts worker w off from the authority (down) or heals the cut:
// on the run's Partition if it has one, else on w's proxies.
func (r *run) cutOff(w int, down bool) error {
	if p := r.cfg.Partition; p != nil {
		if down {
			return p.Cut(w)
		}
		return p.Heal(w)
	}
	for _, p := range r.proxies[w] {
		p.setDown(down)
	}
	return nil
}

// stopAfterSend stops worker w with SIGSTOP as soon as its host has sent a
// packet (M9 on a Partition: the first packet after its release, its next
// acquire's request or part of it, has left its link), and records the
// stop.
func (r *run) stopAfterSend(w int, long time.Duration) error {
	cmd, _ := r.worker(w)
	pid := cmd.Process.Pid
	before, err := r.cfg.Partition.TxPackets(w, pid)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(long)
	for time.Now().Before(deadline) {
		n, err := r.cfg.Partition.TxPackets(w, pid)
		if err != nil {
			return err
		}
		if n > before {
			cmd.Process.Signal(syscall.SIGSTOP)
			r.record(Event{Kind: FaultStart, Worker: w, Fault: string(PauseMidAcquire)})
			return nil
		}
		time.Sleep(200 * time.Microsecond)
	}
	return fmt.Errorf("worker %d sent nothing after its release", w)
}
