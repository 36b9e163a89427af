package main

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strings"
)

// chart is a line chart rendered as plain SVG.
type chart struct {
	title, xlabel, ylabel string
	logX, logY            bool
	series                []series
}

// series is one line: its points (x, y), and how it is drawn. Series of
// one group share a colour and differ by dash.
type series struct {
	name  string
	group string
	dash  int
	pts   [][2]float64
}

var palette = []string{"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"}

var dashes = []string{"", "6,3", "2,3", "8,3,2,3"}

const (
	chartW, chartH         = 760, 380
	padL, padR, padT, padB = 70, 230, 36, 50
	plotW, plotH           = chartW - padL - padR, chartH - padT - padB
)

func (c chart) svg() string {
	var xs, ys []float64
	for _, s := range c.series {
		for _, p := range s.pts {
			if (!c.logX || p[0] > 0) && (!c.logY || p[1] > 0) {
				xs, ys = append(xs, p[0]), append(ys, p[1])
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b,
		`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		chartW, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", chartW, chartH)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", padL, html.EscapeString(c.title))
	if len(xs) == 0 {
		b.WriteString(`<text x="100" y="100">no data</text></svg>` + "\n")
		return b.String()
	}
	x0, x1 := bounds(xs, c.logX)
	y0, y1 := bounds(ys, c.logY)
	sx := scaler(x0, x1, c.logX, padL, padL+plotW)
	sy := scaler(y0, y1, c.logY, padT+plotH, padT)
	// Axes and grid.
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", padL, padT, plotW, plotH)
	xticks := distinctSorted(xs)
	if len(xticks) > 8 || !c.logX {
		xticks = ticks(x0, x1, c.logX)
	}
	for _, t := range xticks {
		x := sx(t)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>`, x, padT, x, padT+plotH)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, padT+plotH+16, tickLabel(t))
	}
	for _, t := range ticks(y0, y1, c.logY) {
		y := sy(t)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>`, padL, y, padL+plotW, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", padL-6, y+4, tickLabel(t))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", padL+plotW/2, chartH-12, html.EscapeString(c.xlabel))
	fmt.Fprintf(&b, `<text transform="translate(16 %d) rotate(-90)" text-anchor="middle">%s</text>`+"\n", padT+plotH/2,
		html.EscapeString(c.ylabel))
	// Lines, points, legend.
	var groups []string
	for i, s := range c.series {
		g := s.group
		if g == "" {
			g = s.name
		}
		if !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
		color := palette[slices.Index(groups, g)%len(palette)]
		pts := slices.Clone(s.pts)
		slices.SortFunc(pts, func(a, b [2]float64) int { return cmpF(a[0], b[0]) })
		var path []string
		for _, p := range pts {
			if (c.logX && p[0] <= 0) || (c.logY && p[1] <= 0) {
				continue
			}
			path = append(path, fmt.Sprintf("%.1f,%.1f", sx(p[0]), sy(p[1])))
		}
		dash := dashes[s.dash%len(dashes)]
		if len(path) > 1 {
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" stroke-dasharray="%s" points="%s"/>`+"\n", color, dash,
				strings.Join(path, " "))
		}
		for _, p := range path {
			xy := strings.Split(p, ",")
			fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`, xy[0], xy[1], color)
		}
		ly := padT + 10 + i*16
		fmt.Fprintf(&b, "\n"+`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2" stroke-dasharray="%s"/>`, padL+plotW+12,
			ly, padL+plotW+36, ly, color, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", padL+plotW+42, ly+4, html.EscapeString(s.name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func cmpF(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func distinctSorted(v []float64) []float64 {
	out := slices.Clone(v)
	slices.Sort(out)
	return slices.Compact(out)
}

// bounds are the axis ends: whole decades on a log axis, 0..max (with
// headroom) on a linear one.
func bounds(v []float64, log bool) (float64, float64) {
	lo, hi := slices.Min(v), slices.Max(v)
	if log {
		lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
		if lo == hi {
			hi = lo * 10
		}
		return lo, hi
	}
	if hi == lo {
		hi = lo + 1
	}
	return math.Min(0, lo), hi * 1.1
}

func scaler(lo, hi float64, log bool, from, to int) func(float64) float64 {
	return func(v float64) float64 {
		var f float64
		if log {
			f = (math.Log10(v) - math.Log10(lo)) / (math.Log10(hi) - math.Log10(lo))
		} else {
			f = (v - lo) / (hi - lo)
		}
		return float64(from) + f*float64(to-from)
	}
}

// ticks are decades on a log axis, about five round steps on a linear one.
func ticks(lo, hi float64, log bool) []float64 {
	var out []float64
	if log {
		for t := lo; t <= hi*1.0001; t *= 10 {
			out = append(out, t)
		}
		return out
	}
	step := math.Pow(10, math.Floor(math.Log10((hi-lo)/5)))
	for _, m := range []float64{1, 2, 5, 10} {
		if (hi-lo)/(step*m) <= 6 {
			step *= m
			break
		}
	}
	for t := math.Ceil(lo/step) * step; t <= hi; t += step {
		out = append(out, t)
	}
	return out
}

func tickLabel(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%gk", v/1e3)
	}
	return fmt.Sprintf("%g", v)
}
