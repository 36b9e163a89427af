package httpapi

import (
	"context"
	"errors"
	"fmt"
	"github.com/fenced-dev/fenced/internal/core/limits"
	"math"
	"net/http"
	"strings"
	"time"
	"unicode"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/cli/leaseplan"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/core/token"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
)

// leaseView is a lease as the API shows it: never the owner token.
type leaseView struct {
	Key   string `json:"key"`
	Held  bool   `json:"held"`
	Fence uint64 `json:"fence"`
	// OwnerDigest is fence.OwnerDigest of the holder's owner token: what a
	// fence guard records with the holder's writes.
	OwnerDigest string `json:"owner_digest,omitempty"`
	// ForeignHolder names a holder that is not a fenced client (an etcd
	// lease, a ZooKeeper session).
	ForeignHolder string `json:"foreign_holder,omitempty"`
	// RemainingMS is the time left by the store's clock (0 when the store
	// does not say, as with etcd and ZooKeeper holders of other clients).
	RemainingMS int64 `json:"remaining_ms"`
	// TTLMS is the grant's TTL when it was made through this server, else
	// the longest time left seen on it; omitted when unknown.
	TTLMS int64 `json:"ttl_ms,omitempty"`
	// HeldSince is when this server first saw the grant (see
	// docs/http-api.md: exact for grants made through it, otherwise within
	// one poll, or the server's start for older grants).
	HeldSince *time.Time `json:"held_since,omitempty"`
	ViaAPI    bool       `json:"via_api,omitempty"`
}

func (s *Server) view(info fenced.LeaseInfo) leaseView {
	v := leaseView{Key: info.Key, Held: info.Held, Fence: info.Fence}
	if !info.Held {
		return v
	}
	v.OwnerDigest, v.ForeignHolder = info.OwnerDigest, foreignHolder(info)
	v.RemainingMS = info.Remaining.Milliseconds()
	if rec, ok := s.obs.record(info.Key); ok && rec.same(info) {
		since := rec.FirstSeen.UTC()
		v.HeldSince, v.TTLMS, v.ViaAPI = &since, rec.TTL.Milliseconds(), rec.Via == "api"
	}
	return v
}

type listView struct {
	Store   string      `json:"store"`
	Backend string      `json:"backend"`
	Now     time.Time   `json:"now"`
	Leases  []leaseView `json:"leases"`
}

func (s *Server) listLeases(w http.ResponseWriter, r *http.Request) {
	prefix := r.URL.Query().Get("prefix")
	if err := checkPrefix(prefix); err != nil {
		writeError(w, err)
		return
	}
	infos, err := s.obs.list(r.Context(), prefix)
	if err != nil {
		writeError(w, storeError(err))
		return
	}
	out := listView{Store: s.cfg.Store, Backend: s.auth.Name, Now: s.cfg.Now().UTC(), Leases: []leaseView{}}
	for _, info := range infos {
		if info.Held {
			out.Leases = append(out.Leases, s.view(info))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func checkPrefix(p string) *apiError {
	if len(p) > limits.MaxKeyLen {
		return &apiError{status: http.StatusBadRequest, Code: "invalid_prefix",
			Message: fmt.Sprintf("prefix is %d bytes, longer than a key may be (%d)", len(p), limits.MaxKeyLen)}
	}
	for _, r := range p {
		if !unicode.IsPrint(r) {
			return &apiError{status: http.StatusBadRequest, Code: "invalid_prefix",
				Message: fmt.Sprintf("prefix %q has a non-printable character", p)}
		}
	}
	return nil
}

type historyView struct {
	Fence         uint64     `json:"fence"`
	OwnerDigest   string     `json:"owner_digest,omitempty"`
	ForeignHolder string     `json:"foreign_holder,omitempty"`
	FirstSeen     time.Time  `json:"first_seen"`
	LastSeen      time.Time  `json:"last_seen"`
	Ended         *time.Time `json:"ended,omitempty"`
	TTLMS         int64      `json:"ttl_ms,omitempty"`
	ViaAPI        bool       `json:"via_api,omitempty"`
}

type breakView struct {
	Time   time.Time `json:"time"`
	Fence  uint64    `json:"fence"`
	Reason string    `json:"reason"`
	By     string    `json:"by"`
}

type keyView struct {
	leaseView
	// History is the grants this server saw, newest first.
	History []historyView `json:"history"`
	// Breaks are the breaks the store recorded, oldest first;
	// BreaksRecorded is false for stores without a break log.
	Breaks         []breakView `json:"breaks"`
	BreaksRecorded bool        `json:"breaks_recorded"`
}

// keyDetails reads one key: 404 for a key never granted.
func (s *Server) keyDetails(ctx context.Context, key string) (keyView, *apiError) {
	if err := fenced.ValidateKey(key); err != nil {
		return keyView{}, storeError(err)
	}
	info, err := s.cfg.Client.Inspect(ctx, key)
	if err != nil {
		return keyView{}, storeError(err)
	}
	s.obs.inspected(info)
	v := keyView{leaseView: s.view(info), History: []historyView{}, Breaks: []breakView{}}
	for _, g := range s.obs.history(key) {
		h := historyView{Fence: g.Fence, OwnerDigest: g.OwnerDigest, ForeignHolder: g.Foreign, FirstSeen: g.FirstSeen.UTC(),
			LastSeen: g.LastSeen.UTC(), TTLMS: g.TTL.Milliseconds(), ViaAPI: g.Via == "api"}
		if !g.Ended.IsZero() {
			e := g.Ended.UTC()
			h.Ended = &e
		}
		v.History = append(v.History, h)
	}
	recs, err := s.cfg.Client.Breaks(ctx, key)
	switch {
	case err == nil:
		v.BreaksRecorded = true
		for _, b := range recs {
			// The record's owner is a prefix of the owner token: not shown.
			v.Breaks = append(v.Breaks, breakView{Time: b.Time.UTC(), Fence: b.Fence, Reason: b.Reason, By: b.By})
		}
	case !errors.Is(err, fenced.ErrUnsupported):
		return keyView{}, storeError(err)
	}
	return v, nil
}

func (s *Server) getLease(w http.ResponseWriter, r *http.Request) {
	v, aerr := s.keyDetails(r.Context(), r.PathValue("key"))
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// keyRequest authorizes r for role and validates the key in its path,
// writing the refusal itself; ok is false when the request was refused.
func (s *Server) keyRequest(w http.ResponseWriter, r *http.Request, role role) (name, key string, ok bool) {
	name, aerr := s.authorize(r, role)
	if aerr != nil {
		s.refused(r, aerr)
		writeError(w, aerr)
		return "", "", false
	}
	key = r.PathValue("key")
	if err := fenced.ValidateKey(key); err != nil {
		writeError(w, storeError(err))
		return "", "", false
	}
	return name, key, true
}

// MaxReasonLen bounds a break's reason, in bytes.
const MaxReasonLen = 1024

func (s *Server) breakLease(w http.ResponseWriter, r *http.Request) {
	name, key, ok := s.keyRequest(w, r, roleAdmin)
	if !ok {
		return
	}
	var body struct {
		Reason string `json:"reason"`
	}
	if aerr := s.decode(w, r, &body, false); aerr != nil {
		writeError(w, aerr)
		return
	}
	if aerr := checkText("reason", body.Reason, MaxReasonLen); aerr != nil {
		writeError(w, aerr)
		return
	}
	by := "http:" + name
	info, err := s.cfg.Client.Break(r.Context(), key, body.Reason, by)
	if err != nil {
		aerr := storeError(err)
		if errors.Is(err, fenced.ErrNotHeld) {
			aerr = &apiError{status: http.StatusNotFound, Code: "not_held", Message: fmt.Sprintf("%s is not held: nothing to break", key)}
		}
		writeError(w, aerr)
		return
	}
	s.obs.ended(key, info.Fence, true)
	s.log.Info("fenced serve: lease broken", "key", key, "fence", info.Fence, "owner_digest", info.OwnerDigest, "by", by, "reason",
		body.Reason, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, struct {
		Broken leaseView `json:"broken"`
		By     string    `json:"by"`
		Reason string    `json:"reason"`
	}{leaseView{Key: key, Held: false, Fence: info.Fence, OwnerDigest: info.OwnerDigest, ForeignHolder: foreignHolder(info)}, by,
		body.Reason})
}

// checkText checks a required free-text field.
func checkText(field, v string, maxLen int) *apiError {
	switch {
	case v == "":
		return &apiError{status: http.StatusBadRequest, Code: "missing_" + field, Message: field + " is required"}
	case len(v) > maxLen:
		return &apiError{status: http.StatusBadRequest, Code: "invalid_" + field,
			Message: fmt.Sprintf("%s is %d bytes, longer than %d", field, len(v), maxLen)}
	}
	for _, r := range v {
		if !unicode.IsPrint(r) {
			return &apiError{status: http.StatusBadRequest, Code: "invalid_" + field, Message: field + " has a non-printable character"}
		}
	}
	return nil
}

// refused logs a refused authorization.
func (s *Server) refused(r *http.Request, e *apiError) {
	s.log.Warn("fenced serve: request refused", "method", r.Method, "path", r.URL.Path, "status", e.status, "reason", e.Message, "remote",
		r.RemoteAddr)
}

// grantView is what acquire and renew answer to the holder.
type grantView struct {
	Key   string `json:"key"`
	Fence uint64 `json:"fence"`
	// Owner is the owner token: it proves ownership for renew and release.
	// Only acquire returns it.
	Owner       string `json:"owner,omitempty"`
	OwnerDigest string `json:"owner_digest"`
	TTLMS       int64  `json:"ttl_ms"`
	// ValidForMS is how long the holder may trust the lease from the
	// moment it receives this answer at the latest: the local validity
	// left when the server answered. Renew well before it runs out, every
	// RenewEveryMS.
	ValidForMS   int64 `json:"valid_for_ms"`
	RenewEveryMS int64 `json:"renew_every_ms"`
}

// MaxOwnerLen bounds an owner token in a request.
const MaxOwnerLen = 64

func (s *Server) acquireLease(w http.ResponseWriter, r *http.Request) {
	name, key, ok := s.keyRequest(w, r, roleClient)
	if !ok {
		return
	}
	var body struct {
		TTLMS    *int64 `json:"ttl_ms"`
		WaitMS   int64  `json:"wait_ms"`
		MinFence string `json:"min_fence"`
	}
	if aerr := s.decode(w, r, &body, true); aerr != nil {
		writeError(w, aerr)
		return
	}
	ttl, aerr := s.requestTTL(body.TTLMS)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	opts := &fenced.LeaseOptions{TTL: ttl, ManualRenew: true}
	switch wait := time.Duration(body.WaitMS) * time.Millisecond; {
	case body.WaitMS < 0:
		writeError(w,
			&apiError{status: http.StatusBadRequest, Code: "invalid_wait", Message: fmt.Sprintf("wait_ms %d is negative", body.WaitMS)})
		return
	case wait > s.cfg.MaxWait:
		writeError(w,
			&apiError{status: http.StatusBadRequest, Code: "invalid_wait",
				Message: fmt.Sprintf("wait_ms %d is longer than this server's limit of %v", body.WaitMS, s.cfg.MaxWait)})
		return
	case wait > 0:
		opts.MaxWait = wait
	}
	switch body.MinFence {
	case "", "strict":
		opts.MinFence = fenced.FenceStrict
	case "repeatable", fenced.FenceRepeatable.String():
		opts.MinFence = fenced.FenceRepeatable
	case "none":
		opts.MinFence = fenced.FenceNone
	default:
		writeError(w,
			&apiError{status: http.StatusBadRequest, Code: "invalid_min_fence",
				Message: fmt.Sprintf("min_fence %q: want strict, repeatable or none", body.MinFence)})
		return
	}
	s.mu.Lock()
	full := len(s.leases) >= s.cfg.MaxLeases
	s.mu.Unlock()
	if full {
		writeError(w,
			&apiError{status: http.StatusTooManyRequests, Code: "too_many_leases",
				Message: fmt.Sprintf("this server already holds %d leases for API clients", s.cfg.MaxLeases)})
		return
	}
	l, err := s.cfg.Client.Acquire(r.Context(), key, opts)
	if err != nil {
		writeError(w, storeError(err))
		return
	}
	digest := token.Digest(l.Owner())
	s.mu.Lock()
	s.leases[l.Owner()] = l
	s.mu.Unlock()
	go func() {
		<-l.Context().Done()
		s.mu.Lock()
		delete(s.leases, l.Owner())
		s.mu.Unlock()
	}()
	s.obs.acquired(fenced.LeaseInfo{Key: key, Held: true, Fence: l.Fence(), OwnerDigest: digest, Remaining: l.Remaining()}, l.Options().TTL)
	s.log.Info("fenced serve: lease granted through the API", "key", key, "fence", l.Fence(), "owner_digest", digest, "ttl",
		l.Options().TTL, "token", name, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, grantView{Key: key, Fence: l.Fence(), Owner: l.Owner(), OwnerDigest: digest,
		TTLMS: l.Options().TTL.Milliseconds(), ValidForMS: l.Remaining().Milliseconds(),
		RenewEveryMS: (l.Options().TTL / 3).Milliseconds()})
}

// holderRequest is the body of renew and release.
type holderRequest struct {
	Owner string `json:"owner"`
	Fence uint64 `json:"fence"`
	// TTLMS is the TTL to renew with when this server no longer knows the
	// lease (it restarted since the acquire); default 30 s. It is
	// checked like every TTL (requestTTL) whether or not it is used.
	TTLMS *int64 `json:"ttl_ms"`

	ttl time.Duration // TTLMS, checked
}

// requestTTL returns the TTL a request's ttl_ms asks for (30 s when
// it is absent), checked as every lease's TTL is checked, by
// Client.Resolve (the package's bounds and the backend's), or the 400
// refusal naming the field.
func (s *Server) requestTTL(ms *int64) (time.Duration, *apiError) {
	if ms == nil {
		return ttlrule.Default, nil
	}
	refuse := func(why string) *apiError {
		return &apiError{status: http.StatusBadRequest, Code: "invalid_ttl", Message: fmt.Sprintf("ttl_ms %d: %s", *ms, why)}
	}
	if *ms == 0 {
		// LeaseOptions would take a zero TTL for "inherit".
		return 0, refuse(fmt.Sprintf("not a TTL; leave ttl_ms out for the default (%v)", ttlrule.Default))
	}
	ttl := time.Duration(*ms) * time.Millisecond
	if ttl/time.Millisecond != time.Duration(*ms) {
		// Overflowed: beyond every bound, on the same side.
		ttl = math.MaxInt64
		if *ms < 0 {
			ttl = math.MinInt64
		}
	}
	// Only the TTL is asked about: the rest accepts anything.
	_, err := s.cfg.Client.Resolve(&fenced.LeaseOptions{TTL: ttl, MinFence: fenced.FenceNone, ManualRenew: true})
	if errors.Is(err, fenced.ErrInvalidTTL) {
		return 0, refuse(strings.TrimPrefix(err.Error(), "fenced: "))
	}
	return ttl, nil
}

// holder authorizes a renew or release and finds the lease it names: the
// lease this server holds for the owner, or nil when the server does not
// know it (it restarted), for the driver to judge.
func (s *Server) holder(w http.ResponseWriter, r *http.Request) (string, holderRequest, *fenced.Lease, bool) {
	var req holderRequest
	_, key, ok := s.keyRequest(w, r, roleClient)
	if !ok {
		return "", req, nil, false
	}
	if aerr := s.decode(w, r, &req, false); aerr != nil {
		writeError(w, aerr)
		return "", req, nil, false
	}
	if aerr := checkText("owner", req.Owner, MaxOwnerLen); aerr != nil {
		writeError(w, aerr)
		return "", req, nil, false
	}
	ttl, aerr := s.requestTTL(req.TTLMS)
	if aerr != nil {
		writeError(w, aerr)
		return "", req, nil, false
	}
	req.ttl = ttl
	s.mu.Lock()
	l := s.leases[req.Owner]
	s.mu.Unlock()
	if l != nil && (l.Key() != key || l.Fence() != req.Fence) {
		writeError(w,
			&apiError{status: http.StatusConflict, Code: "not_held",
				Message: fmt.Sprintf("this owner does not hold %s with fence %d", key, req.Fence)})
		return "", req, nil, false
	}
	return key, req, l, true
}

func (s *Server) renewLease(w http.ResponseWriter, r *http.Request) {
	key, req, l, ok := s.holder(w, r)
	if !ok {
		return
	}
	if l != nil {
		if err := l.Renew(r.Context()); err != nil {
			writeError(w, storeError(err))
			return
		}
		writeJSON(w, http.StatusOK, grantView{Key: key, Fence: l.Fence(), OwnerDigest: token.Digest(l.Owner()),
			TTLMS: l.Options().TTL.Milliseconds(), ValidForMS: l.Remaining().Milliseconds(),
			RenewEveryMS: (l.Options().TTL / 3).Milliseconds()})
		return
	}
	ttl := req.ttl
	// The server no longer knows this lease: the authority judges owner
	// and fence.
	sent := time.Now()
	if err := rootaccess.Driver(s.cfg.Client).Renew(r.Context(),
		driver.Grant{Key: key, Owner: req.Owner, Fence: req.Fence, TTL: ttl}); err != nil {
		writeError(w, storeError(err))
		return
	}
	valid := ttl - ttlrule.DefaultSafetyMargin(ttl) - time.Since(sent)
	writeJSON(w, http.StatusOK, grantView{Key: key, Fence: req.Fence, OwnerDigest: token.Digest(req.Owner),
		TTLMS: ttl.Milliseconds(), ValidForMS: max(valid, 0).Milliseconds(), RenewEveryMS: (ttl / 3).Milliseconds()})
}

func (s *Server) releaseLease(w http.ResponseWriter, r *http.Request) {
	key, req, l, ok := s.holder(w, r)
	if !ok {
		return
	}
	var err error
	if l != nil {
		err = l.Release(r.Context())
	} else {
		err = rootaccess.Driver(s.cfg.Client).Release(r.Context(), driver.Grant{Key: key, Owner: req.Owner, Fence: req.Fence})
	}
	if err != nil {
		writeError(w, storeError(err))
		return
	}
	s.obs.ended(key, req.Fence, false)
	s.log.Info("fenced serve: lease released through the API", "key", key, "fence", req.Fence, "owner_digest",
		token.Digest(req.Owner), "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, struct {
		Released bool   `json:"released"`
		Key      string `json:"key"`
		Fence    uint64 `json:"fence"`
	}{true, key, req.Fence})
}

func (s *Server) plan(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	in := leaseplan.Input{TTL: ttlrule.Default, Authority: s.auth}
	if b := q.Get("backend"); b != "" && b != s.auth.Scheme {
		a, ok := leaseplan.Authorities()[b]
		if !ok {
			writeError(w,
				&apiError{status: http.StatusBadRequest, Code: "invalid_backend",
					Message: fmt.Sprintf("backend %q is not one of fenced's URL schemes", b)})
			return
		}
		in.Authority = a
	}
	for _, p := range []struct {
		name string
		dst  *time.Duration
	}{{"ttl", &in.TTL}, {"renew_every", &in.RenewEvery}, {"max_pause", &in.MaxPause}} {
		v := q.Get(p.name)
		if v == "" {
			continue
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			writeError(w,
				&apiError{status: http.StatusBadRequest, Code: "invalid_" + p.name,
					Message: fmt.Sprintf("%s=%q is not a duration such as 30s or 1500ms", p.name, v)})
			return
		}
		*p.dst = d
	}
	plan, err := leaseplan.Compute(in)
	if err != nil {
		writeError(w, &apiError{status: http.StatusBadRequest, Code: "invalid_plan", Message: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, plan.JSON())
}

// ScenarioTimeout bounds one request for the billing scenario, retries included.
const ScenarioTimeout = time.Minute

func (s *Server) runScenario(w http.ResponseWriter, r *http.Request) {
	if _, aerr := s.authorize(r, roleClient); aerr != nil {
		s.refused(r, aerr)
		writeError(w, aerr)
		return
	}
	if s.cfg.Scenario == nil {
		writeError(w, &apiError{status: http.StatusNotImplemented, Code: "unsupported", Message: "this server does not run the scenario"})
		return
	}
	var body struct {
		Fence *bool `json:"fence"`
	}
	if aerr := s.decode(w, r, &body, true); aerr != nil {
		writeError(w, aerr)
		return
	}
	withFence := body.Fence == nil || *body.Fence
	if !s.scenario.TryLock() {
		writeError(w,
			&apiError{status: http.StatusConflict, Code: "busy", Message: "a scenario is already running; try again when it is over"})
		return
	}
	defer s.scenario.Unlock()
	ctx, cancel := context.WithTimeout(r.Context(), ScenarioTimeout)
	defer cancel()
	res, err := s.cfg.Scenario(ctx, withFence)
	if err != nil {
		writeError(w, &apiError{status: http.StatusServiceUnavailable, Code: "scenario_failed", Message: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	_, err := s.cfg.Client.Inspect(ctx, "fenced:healthz")
	if err != nil && !errors.Is(err, fenced.ErrNotFound) {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "message": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "store": s.cfg.Store})
}
