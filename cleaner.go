package fenced

import "sync"

// cleaner runs what follows the end of a lease (the driver's stop of its
// loss watch; for the leases the schedule ends, their Lost hooks too) on
// at most maxCleaners goroutines of its own, started on demand and gone
// once the queue is empty, so that the goroutine ending a lease (the
// schedule's, Close's, a renewal's) never waits for the driver.
// A driver call that never returns holds up one worker, not the leases:
// with every worker stuck the queue grows (a closure per ended lease)
// while leases still end on time, and no more goroutines are started.
type cleaner struct {
	mu      sync.Mutex
	queue   []func()
	workers int
	idle    chan struct{} // closed when workers drops to zero; nil while none wait
}

// maxCleaners bounds the goroutines of a client's cleaner.
const maxCleaners = 8

// do queues f to run on a worker.
func (q *cleaner) do(f func()) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.queue = append(q.queue, f)
	if q.workers < maxCleaners {
		q.workers++
		go q.work()
	}
}

func (q *cleaner) work() {
	for {
		q.mu.Lock()
		if len(q.queue) == 0 {
			q.workers--
			if q.workers == 0 && q.idle != nil {
				close(q.idle)
				q.idle = nil
			}
			q.mu.Unlock()
			return
		}
		f := q.queue[0]
		q.queue[0] = nil
		q.queue = q.queue[1:]
		q.mu.Unlock()
		f()
	}
}

// wait returns once the queue is empty and no work is running.
func (q *cleaner) wait() {
	q.mu.Lock()
	if q.workers == 0 {
		q.mu.Unlock()
		return
	}
	if q.idle == nil {
		q.idle = make(chan struct{})
	}
	idle := q.idle
	q.mu.Unlock()
	<-idle
}
