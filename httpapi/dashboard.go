package httpapi

import (
	"embed"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/fenced-dev/fenced/internal/cli/leaseplan"
)

// The dashboard: server-rendered pages (so they show the state without
// JavaScript) that assets/app.js keeps live by polling the JSON API. No
// build step and no CDN: everything is embedded.

//go:embed assets
var assets embed.FS

// stampLayout is the one format of every time the dashboard shows, in
// UTC (app.js's stamp writes the same).
const stampLayout = "2006-01-02 15:04:05 UTC"

var pages = template.Must(template.New("").Funcs(template.FuncMap{
	"ms": func(ms int64) string {
		if ms <= 0 {
			return "–"
		}
		return (time.Duration(ms) * time.Millisecond).Round(100 * time.Millisecond).String()
	},
	"pct": func(remaining, ttl int64) int64 {
		if ttl <= 0 || remaining <= 0 {
			return 0
		}
		return min(100, remaining*100/ttl)
	},
	"when": func(t *time.Time) string {
		if t == nil {
			return "–"
		}
		return t.UTC().Format(stampLayout)
	},
	"stamp":  func(t time.Time) string { return t.UTC().Format(stampLayout) },
	"keyURL": func(key string) string { return "/keys/" + url.PathEscape(key) },
	"groupURL": func(group string) string {
		parts := strings.Split(group, "/")
		for i, p := range parts {
			parts[i] = url.PathEscape(p)
		}
		return "/partitions/" + strings.Join(parts, "/")
	},
}).ParseFS(assets, "assets/*.html"))

// contentSecurity allows only the server's own scripts, styles and API.
const contentSecurity = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; " +
	"form-action 'none'; frame-ancestors 'none'"

func staticHandler() http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err)
	}
	return http.StripPrefix("/static/", http.FileServerFS(sub))
}

type backendOption struct {
	Scheme, Name string
	Selected     bool
}

type indexPage struct {
	Store, Backend string
	Leases         []leaseView
	Error          string
	Backends       []backendOption
	Plan           leaseplan.JSON
	Scenario       bool
	// Groups are the partition groups with a live member.
	Groups []groupLink
}

func (s *Server) dashboard(w http.ResponseWriter, r *http.Request) {
	p := indexPage{Store: s.cfg.Store, Backend: s.auth.Name, Scenario: s.cfg.Scenario != nil}
	infos, err := s.obs.list(r.Context(), "")
	if err != nil {
		p.Error = storeError(err).Message
	}
	for _, info := range infos {
		if info.Held {
			p.Leases = append(p.Leases, s.view(info))
		}
	}
	p.Groups = partitionGroups(infos)
	for i, g := range p.Groups {
		p.Groups[i].Moves, p.Groups[i].LastMove = s.obs.groupMoved(g.Group)
	}
	seen := map[string]bool{}
	for scheme, a := range leaseplan.Authorities() {
		if seen[a.Name] && scheme != s.auth.Scheme {
			continue // postgresql, rediss: aliases
		}
		seen[a.Name] = true
		p.Backends = append(p.Backends, backendOption{Scheme: scheme, Name: a.Name, Selected: scheme == s.auth.Scheme})
	}
	sort.Slice(p.Backends, func(i, j int) bool { return p.Backends[i].Name < p.Backends[j].Name })
	if plan, err := leaseplan.Compute(leaseplan.Input{TTL: 30 * time.Second, Authority: s.auth}); err == nil {
		p.Plan = plan.JSON()
	}
	s.render(w, "index.html", p)
}

type keyPage struct {
	Store string
	keyView
	Error string
}

func (s *Server) keyPage(w http.ResponseWriter, r *http.Request) {
	v, aerr := s.keyDetails(r.Context(), r.PathValue("key"))
	p := keyPage{Store: s.cfg.Store, keyView: v}
	if aerr != nil {
		p.Key, p.Error = r.PathValue("key"), aerr.Message
		w.Header().Set("Content-Security-Policy", contentSecurity)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(aerr.status)
		_ = pages.ExecuteTemplate(w, "key.html", p)
		return
	}
	s.render(w, "key.html", p)
}

func (s *Server) render(w http.ResponseWriter, name string, data any) {
	w.Header().Set("Content-Security-Policy", contentSecurity)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Referrer-Policy", "no-referrer")
	if err := pages.ExecuteTemplate(w, name, data); err != nil {
		s.log.Error("fenced serve: render", "page", name, "err", err)
	}
}
