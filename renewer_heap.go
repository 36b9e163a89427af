package fenced

// The heap: a binary min-heap on Lease.wake that keeps Lease.heapIdx.
// r.mu must be held.

func (r *renewer) push(l *Lease) {
	l.heapIdx = len(r.heap)
	r.heap = append(r.heap, l)
	r.up(l.heapIdx)
}

func (r *renewer) removeAt(i int) {
	h := r.heap
	last := len(h) - 1
	gone := h[i]
	if i != last {
		h[i] = h[last]
		h[i].heapIdx = i
	}
	h[last] = nil
	r.heap = h[:last]
	gone.heapIdx = -1
	if i != last {
		r.fix(i)
	}
}

func (r *renewer) heapify() {
	for i := len(r.heap)/2 - 1; i >= 0; i-- {
		r.down(i)
	}
}

func (r *renewer) fix(i int) {
	if !r.down(i) {
		r.up(i)
	}
}

func (r *renewer) up(i int) {
	h := r.heap
	for i > 0 {
		parent := (i - 1) / 2
		if h[parent].wake <= h[i].wake {
			break
		}
		h[parent], h[i] = h[i], h[parent]
		h[parent].heapIdx, h[i].heapIdx = parent, i
		i = parent
	}
}

// down sifts h[i] down and reports whether it moved.
func (r *renewer) down(i int) bool {
	h := r.heap
	start := i
	for {
		least := i
		if l := 2*i + 1; l < len(h) && h[l].wake < h[least].wake {
			least = l
		}
		if rt := 2*i + 2; rt < len(h) && h[rt].wake < h[least].wake {
			least = rt
		}
		if least == i {
			return i != start
		}
		h[least], h[i] = h[i], h[least]
		h[least].heapIdx, h[i].heapIdx = least, i
		i = least
	}
}
