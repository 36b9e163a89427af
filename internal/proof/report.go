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
	fmt.Fprintln(w, "| backend | fault | fencing | ordering | runs | grants | writes accepted | stale attempted / refused / accepted | fence regressions (repeats) | overlaps (longest) | duplicate effects | porcupine | recovery | hazard seen |")
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

// WriteTimelineSVG draws a history as an SVG timeline: one lane per
// worker, a bar from each grant to the moment its holder learnt it had
// ended (labelled with the fence), the fault windows shaded, accepted
// writes as filled circles and refused ones as crosses. Only the window
// from 1.5 s before the first fault to 3 s after the last is drawn.
func WriteTimelineSVG(w io.Writer, title string, events []Event) {
	sort.SliceStable(events, func(i, j int) bool { return events[i].T < events[j].T })
	if len(events) == 0 {
		return
	}
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
	const left, width, lane, top = 70, 900, 46, 40
	height := top + lane*max(workers, 1) + 40
	x := func(t int64) float64 {
		return left + float64(t-lo)/float64(max(hi-lo, 1))*width
	}
	y := func(wk int) int { return top + wk*lane }
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", left+width+20, height)
	fmt.Fprintf(w, `<text x="%d" y="18" font-size="13">%s</text>`+"\n", left, escape(title))
	for i := range workers {
		fmt.Fprintf(w, `<text x="6" y="%d">worker %d</text><line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#ccc"/>`+"\n", y(i)+20, i, left, y(i)+lane-4, left+width, y(i)+lane-4)
	}
	// Fault windows.
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
			y0, h := top-6, lane*workers
			if e.Worker >= 0 && e.Worker < workers {
				y0, h = y(e.Worker)+2, lane-8
			}
			fmt.Fprintf(w, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#f4a" fill-opacity="0.18"/><text x="%.1f" y="%d" fill="#a03">%s</text>`+"\n",
				x(max(s, lo)), y0, max(x(min(e.T, hi))-x(max(s, lo)), 2), h, x(max(s, lo))+2, y0+10, escape(e.Fault))
		}
	}
	// Lease bars.
	type bar struct {
		start  int64
		fence  uint64
		worker int
	}
	held := map[string]bar{}
	endBar := func(key string, t int64) {
		b, ok := held[key]
		if !ok {
			return
		}
		delete(held, key)
		if t < lo || b.start > hi {
			return
		}
		fmt.Fprintf(w, `<rect x="%.1f" y="%d" width="%.1f" height="14" fill="#69c" fill-opacity="0.6"/><text x="%.1f" y="%d">f=%d</text>`+"\n",
			x(max(b.start, lo)), y(b.worker)+14, max(x(min(t, hi))-x(max(b.start, lo)), 1), x(max(b.start, lo))+2, y(b.worker)+12, b.fence)
	}
	for _, e := range events {
		id := fmt.Sprintf("%d/%d", e.PID, e.Fence)
		switch e.Kind {
		case AcquireOK:
			held[id] = bar{e.T, e.Fence, e.Worker}
		case Lost, ReleaseInvoke:
			endBar(id, e.T)
		case FaultStart:
			if e.Fault == string(KillHolder) {
				for k, b := range held {
					if strings.HasPrefix(k, fmt.Sprintf("%d/", e.PID)) {
						_ = b
						endBar(k, e.T)
					}
				}
			}
		case WriteOK, WriteRefused:
			if e.T < lo || e.T > hi {
				continue
			}
			cx, cy := x(e.T), y(e.Worker)+34
			if e.Kind == WriteOK {
				fmt.Fprintf(w, `<circle cx="%.1f" cy="%d" r="4" fill="#283"/>`+"\n", cx, cy)
			} else {
				fmt.Fprintf(w, `<path d="M%.1f %d l8 8 m0 -8 l-8 8" stroke="#c00" stroke-width="2"/><text x="%.1f" y="%d" fill="#c00">refused f=%d &lt; %d</text>`+"\n", cx-4, cy-4, cx+6, cy+4, e.Fence, e.Current)
			}
		}
	}
	for k := range held {
		endBar(k, hi)
	}
	fmt.Fprintf(w, `<text x="%d" y="%d" fill="#555">%.1f s shown; bars: lease believed held (grant to loss/release), f = fence; dots: write accepted; crosses: write refused; shaded: fault</text>`+"\n", left, height-10, float64(hi-lo)/1e9)
	fmt.Fprintln(w, "</svg>")
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
