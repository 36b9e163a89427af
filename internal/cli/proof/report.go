package proof

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// Row is one line of the published matrix.
type Row struct {
	Backend  string
	Fault    Fault
	Fencing  bool
	Ordering Ordering
	// Report is nil when the scenario was not run; NA then says why.
	Report *Report
	NA     string
}

// WriteMarkdownTable writes rows as a Markdown table.
func WriteMarkdownTable(w io.Writer, rows []Row) {
	fmt.Fprintln(w,
		"| backend | fault | fencing | ordering | runs | grants | writes accepted | stale attempted / refused / accepted | fence "+
			"regressions (repeats) | overlaps (longest) | duplicate effects | porcupine | recovery | hazard seen |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | ---: | ---: | ---: | --- | --- | --- | ---: | --- | ---: | --- |")
	for _, r := range rows {
		fencing := "off"
		if r.Fencing {
			fencing = "on"
		}
		if r.Report == nil {
			fmt.Fprintf(w, "| %s | %s | %s | %s | n/a: %s |||||||||\n", r.Backend, r.Fault.ID(), fencing, r.Ordering, r.NA)
			continue
		}
		p := r.Report
		fmt.Fprintf(w, "| %s | %s | %s | %s | %d | %d | %d | %d / %d / %d | %d (%d) | %d (%v) | %d | %s | %v | %v |\n",
			r.Backend, r.Fault.ID(), fencing, r.Ordering, p.Injections, p.Grants, p.WritesAccepted,
			p.StaleAttempted, p.StaleRefused, p.StaleAccepted, p.FenceRegressions, p.FenceRepeats,
			p.Overlaps, p.LongestOverlap.Round(time.Millisecond), p.DuplicateEffects, p.Linearizability,
			p.Recovery.Round(time.Millisecond), p.HazardSeen)
	}
}

// WriteTimelineSVG draws a history as an SVG timeline, with one lane per
// worker. A bar runs from each grant to the moment its holder learnt it had
// ended, labelled with the fence. The fault windows are shaded. Accepted
// writes are filled circles and refused ones crosses. Only the window from
// 1.5 s before the first fault to 3 s after the last is drawn.
func WriteTimelineSVG(w io.Writer, title string, events []Event) {
	sort.SliceStable(events, func(i, j int) bool { return events[i].T < events[j].T })
	if len(events) == 0 {
		return
	}
	tl := newTimeline(w, events)
	tl.frame(title)
	tl.faults(events)
	tl.leases(events)
	fmt.Fprintf(w,
		`<text x="%d" y="%d" fill="#555">%.1f s shown; bars: lease believed held (grant to loss/release), f = fence; dots: `+
			`write accepted; crosses: write refused; shaded: fault</text>`+"\n", tlLeft, tl.height-10, float64(tl.hi-tl.lo)/1e9)
	fmt.Fprintln(w, "</svg>")
}

// The timeline's geometry, in pixels: the left margin, the drawing's
// width, the height of a worker's lane, and the top margin.
const tlLeft, tlWidth, tlLane, tlTop = 70, 900, 46, 40

// timelineBar is a lease drawn from its grant (start) until it ends.
type timelineBar struct {
	start  int64
	fence  uint64
	worker int
}

// timeline draws one history's SVG timeline over the window [lo, hi].
type timeline struct {
	w       io.Writer
	lo, hi  int64
	workers int
	height  int
	held    map[string]timelineBar // the bars not yet drawn, by pid/fence
}

// newTimeline returns the timeline of events, sorted by time and not empty.
// The window runs from 1.5 s before the first fault to 3 s after the last.
func newTimeline(w io.Writer, events []Event) *timeline {
	lo, hi := events[0].T, events[len(events)-1].T
	var fs, fe int64
	for _, e := range events {
		if e.Kind == FaultStart && fs == 0 {
			fs = e.T
		}
		if e.Kind == FaultEnd || e.Kind == FaultStart {
			fe = e.T
		}
	}
	if fs != 0 {
		lo = max(lo, fs-int64(1500*time.Millisecond))
		hi = min(hi, fe+int64(3*time.Second))
	}
	workers := 0
	for _, e := range events {
		workers = max(workers, e.Worker+1)
	}
	return &timeline{
		w: w, lo: lo, hi: hi, workers: workers,
		height: tlTop + tlLane*max(workers, 1) + 40,
		held:   map[string]timelineBar{},
	}
}

// x returns the abscissa of instant t.
func (tl *timeline) x(t int64) float64 {
	return tlLeft + float64(t-tl.lo)/float64(max(tl.hi-tl.lo, 1))*tlWidth
}

// y returns the top of worker wk's lane.
func (tl *timeline) y(wk int) int { return tlTop + wk*tlLane }

// frame opens the SVG and draws the title and the workers' lanes.
func (tl *timeline) frame(title string) {
	w := tl.w
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n",
		tlLeft+tlWidth+20, tl.height)
	fmt.Fprintf(w, `<text x="%d" y="18" font-size="13">%s</text>`+"\n", tlLeft, escape(title))
	for i := range tl.workers {
		fmt.Fprintf(w, `<text x="6" y="%d">worker %d</text><line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#ccc"/>`+"\n", tl.y(i)+20, i,
			tlLeft, tl.y(i)+tlLane-4, tlLeft+tlWidth, tl.y(i)+tlLane-4)
	}
}

// faults shades the fault windows: a worker's lane, or every lane.
func (tl *timeline) faults(events []Event) {
	open := map[string]int64{}
	for _, e := range events {
		k := fmt.Sprintf("%s/%d", e.Fault, e.Worker)
		switch e.Kind {
		case FaultStart:
			open[k] = e.T
		case FaultEnd:
			s, ok := open[k]
			if !ok {
				s = e.T
			}
			delete(open, k)
			y0, h := tlTop-6, tlLane*tl.workers
			if e.Worker >= 0 && e.Worker < tl.workers {
				y0, h = tl.y(e.Worker)+2, tlLane-8
			}
			fmt.Fprintf(tl.w,
				`<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#f4a" fill-opacity="0.18"/><text x="%.1f" y="%d" `+
					`fill="#a03">%s</text>`+"\n",
				tl.x(max(s, tl.lo)), y0, max(tl.x(min(e.T, tl.hi))-tl.x(max(s, tl.lo)), 2), h, tl.x(max(s, tl.lo))+2, y0+10,
				escape(e.Fault))
		}
	}
}

// leases draws the lease bars and the writes, accepted or refused.
func (tl *timeline) leases(events []Event) {
	for _, e := range events {
		id := fmt.Sprintf("%d/%d", e.PID, e.Fence)
		switch e.Kind {
		case AcquireOK:
			tl.held[id] = timelineBar{e.T, e.Fence, e.Worker}
		case Lost, ReleaseInvoke:
			tl.endBar(id, e.T)
		case FaultStart:
			if e.Fault == string(KillHolder) {
				for k := range tl.held {
					if strings.HasPrefix(k, fmt.Sprintf("%d/", e.PID)) {
						tl.endBar(k, e.T)
					}
				}
			}
		case WriteOK, WriteRefused:
			tl.write(e)
		}
	}
	for k := range tl.held {
		tl.endBar(k, tl.hi)
	}
}

// endBar draws the bar of lease key, ended at t, if it is in the window.
func (tl *timeline) endBar(key string, t int64) {
	b, ok := tl.held[key]
	if !ok {
		return
	}
	delete(tl.held, key)
	if t < tl.lo || b.start > tl.hi {
		return
	}
	fmt.Fprintf(tl.w,
		`<rect x="%.1f" y="%d" width="%.1f" height="14" fill="#69c" fill-opacity="0.6"/><text x="%.1f" y="%d">f=%d</text>`+"\n",
		tl.x(max(b.start, tl.lo)), tl.y(b.worker)+14, max(tl.x(min(t, tl.hi))-tl.x(max(b.start, tl.lo)), 1), tl.x(max(b.start, tl.lo))+2,
		tl.y(b.worker)+12, b.fence)
}

// write marks a write in the window: a dot if accepted, a cross if refused.
func (tl *timeline) write(e Event) {
	if e.T < tl.lo || e.T > tl.hi {
		return
	}
	cx, cy := tl.x(e.T), tl.y(e.Worker)+34
	if e.Kind == WriteOK {
		fmt.Fprintf(tl.w, `<circle cx="%.1f" cy="%d" r="4" fill="#283"/>`+"\n", cx, cy)
	} else {
		fmt.Fprintf(tl.w,
			`<path d="M%.1f %d l8 8 m0 -8 l-8 8" stroke="#c00" stroke-width="2"/><text x="%.1f" y="%d" fill="#c00">refused f=%d &lt; `+
				`%d</text>`+"\n", cx-4, cy-4, cx+6, cy+4, e.Fence, e.Current)
	}
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
