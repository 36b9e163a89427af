package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/httpapi"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/core/storeurl"
	"github.com/fenced-dev/fenced/metrics/fencedprom"
)

type serveFlags struct {
	addr                 string
	adminTokens, clients string
	tlsCert, tlsKey      string
	poll                 time.Duration
}

func newServeCmd(g *globals) *cobra.Command {
	f := &serveFlags{}
	cmd := &cobra.Command{
		Use:   "serve [--addr 127.0.0.1:7420] [--admin-token-file F] [--tls-cert F --tls-key F]",
		Short: "Serve an HTTP API, Prometheus metrics and a live dashboard over the store",
		Long: `Serve runs an HTTP service over one store:

  /                          live dashboard: held leases with time-left bars and a break
                             button, each key's grants and breaks, the lease trade-off
                             explorer, and the billing scenario drawn as a timeline
  /api/v1/leases[?prefix=]   held leases (JSON): key, fence, owner digest, TTL, time left
  /api/v1/leases/KEY         one key: holder, fence, time left, grant history, breaks
  /api/v1/leases/KEY/break   POST {"reason": "..."}: admin token; audited with its name
  /api/v1/leases/KEY/acquire POST, and /renew, /release: for clients in other languages
  /keys/KEY                  one key's page: holder, fence, grant history, breaks
  /partitions/GROUP          a partition group's page: members, each partition's owner
  /api/v1/partitions/GROUP   the same as JSON (fenced partitions ls -o json)
  /api/v1/plan               the lease trade-off (fenced plan) as JSON
  /api/v1/scenario           POST: runs the billing scenario (client token)
  /metrics                   Prometheus: fenced_store_* and the server's own fenced_*
  /healthz                   200 when the store answers

Every POST needs Authorization: Bearer TOKEN. Token files hold one token per line,
"NAME SECRET" (the name goes into the audit record of a break) or just "SECRET", and
must not be readable by group or others. Admin tokens may break leases; client tokens
(--client-token-file) may acquire, renew and release them and run the scenario.

It listens on loopback by default and answers only to localhost Host names there. It
refuses a non-loopback address without a token file. Listings never show owner
tokens, only their digests (what fence guards record). See docs/http-api.md.

Leases acquired through the API are not released when the server stops: their holders
keep them until their TTL, and can renew them through the restarted server (except
on etcd and ZooKeeper, where a grant lives in the server's session).`,
		Example: `  openssl rand -hex 32 | sed 's/^/alice /' > ~/.fenced-admin && chmod 600 ~/.fenced-admin
  fenced serve --admin-token-file ~/.fenced-admin
  fenced serve --store postgres://app@db/app --addr 0.0.0.0:7420 --admin-token-file /etc/fenced/admin \
      --tls-cert /etc/fenced/cert.pem --tls-key /etc/fenced/key.pem`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runServe(cmd.Context(), g, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.addr, "addr", "127.0.0.1:7420", "address to listen on (host:port; port 0 picks a free one)")
	fl.StringVar(&f.adminTokens, "admin-token-file", "", "file of admin tokens (may break leases); required off loopback")
	fl.StringVar(&f.clients, "client-token-file", "", "file of client tokens (may acquire, renew and release leases)")
	fl.StringVar(&f.tlsCert, "tls-cert", "", "serve HTTPS with this certificate (PEM); needs --tls-key")
	fl.StringVar(&f.tlsKey, "tls-key", "", "the certificate's private key (PEM)")
	fl.DurationVar(&f.poll, "poll", httpapi.DefaultPollEvery, "how often to list the store to follow grants (history, churn)")
	return cmd
}

func runServe(ctx context.Context, g *globals, f *serveFlags) error {
	if (f.tlsCert == "") != (f.tlsKey == "") {
		return withCode(exitUsage, errors.New("serve: --tls-cert and --tls-key go together"))
	}
	if f.poll <= 0 {
		return withCode(exitUsage, fmt.Errorf("serve: --poll %v must be positive", f.poll))
	}
	var admins, clients []httpapi.Token
	var err error
	if f.adminTokens != "" {
		if admins, err = httpapi.ReadTokenFile(f.adminTokens, "admin"); err != nil {
			return withCode(exitUsage, fmt.Errorf("serve: --admin-token-file: %w", err))
		}
	}
	if f.clients != "" {
		if clients, err = httpapi.ReadTokenFile(f.clients, "client"); err != nil {
			return withCode(exitUsage, fmt.Errorf("serve: --client-token-file: %w", err))
		}
	}
	loopback, err := loopbackAddr(ctx, f.addr)
	if err != nil {
		return withCode(exitUsage, fmt.Errorf("serve: --addr %q: %w", f.addr, err))
	}
	if !loopback && f.adminTokens == "" {
		return withCode(exitUsage,
			fmt.Errorf("serve: refusing to listen on %s: not loopback, and no --admin-token-file; "+
				"give one (and TLS), or listen on 127.0.0.1", f.addr))
	}
	if !loopback && f.tlsCert == "" {
		fmt.Fprintf(g.stderr,
			"fenced serve: warning: %s is not loopback and TLS is off: tokens and lease data cross the network in clear text "+
				"(use --tls-cert and --tls-key, or a TLS proxy)\n", f.addr)
	}
	u, err := storeurl.Parse(g.store)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := fencedprom.New(reg, nil)
	if err != nil {
		return err
	}
	g.noteStore()
	c, err := fenced.Open(ctx, g.store, &fenced.Options{Hook: m.Hook(u.Scheme)})
	if err != nil {
		return err
	}
	// Not c.Close: that would release the leases API clients still hold.
	defer rootaccess.Driver(c).Close()
	srv, err := httpapi.New(httpapi.Config{
		Client: c, Store: describeStore(g.store), Scheme: u.Scheme,
		AdminTokens: admins, ClientTokens: clients,
		Registry: reg, Scenario: serveScenario, LoopbackOnly: loopback, PollEvery: f.poll,
		Logger: slog.New(slog.NewTextHandler(g.stderr, nil)),
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return withCode(exitUnavailable, fmt.Errorf("serve: %w", err))
	}
	scheme := "http"
	if f.tlsCert != "" {
		scheme = "https"
	}
	fmt.Fprintf(g.stdout, "fenced serve: listening on %s://%s (store %s)\n", scheme, ln.Addr(), describeStore(g.store))
	hs := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      httpapi.DefaultMaxWait + httpapi.ScenarioTimeout/2,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	go srv.Run(ctx)
	served := make(chan error, 1)
	go func() {
		if f.tlsCert != "" {
			served <- hs.ServeTLS(ln, f.tlsCert, f.tlsKey)
		} else {
			served <- hs.Serve(ln)
		}
	}()
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return hs.Shutdown(sctx)
}

// loopbackAddr reports whether host:port names only loopback addresses. An
// empty host (all interfaces) is not loopback; a name is resolved.
func loopbackAddr(ctx context.Context, addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, err
	}
	if host == "" {
		return false, nil
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback(), nil
	}
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return false, err
	}
	for _, ip := range ips {
		if !ip.IP.IsLoopback() {
			return false, nil
		}
	}
	return len(ips) > 0, nil
}

// serveScenario runs fenced demo's billing scenario for the dashboard:
// like fenced demo, again with a longer TTL when the machine was too busy
// to demonstrate anything. The result is the last run's.
func serveScenario(ctx context.Context, withFence bool) (httpapi.ScenarioResult, error) {
	var (
		res    httpapi.ScenarioResult
		out    scenarioOutcome
		runErr error
	)
	// Its error is runErr or out.Err of the last try, both kept here.
	_ = untilDemonstrated(func(ttl time.Duration) error {
		res = httpapi.ScenarioResult{Fenced: withFence, Events: []httpapi.ScenarioEvent{}, Sends: []httpapi.ScenarioSend{}}
		out, runErr = runScenario(ctx, ttl, !withFence, false, func(string) {}, func(e scenarioEvent) {
			res.Events = append(res.Events,
				httpapi.ScenarioEvent{AtMS: e.At.Milliseconds(), Worker: e.Worker, Kind: e.Kind, Fence: e.Fence, Text: e.Text})
		})
		if runErr != nil {
			return runErr
		}
		return out.Err
	}, func(time.Duration) {})
	if runErr != nil {
		return res, runErr
	}
	for _, s := range out.Sends {
		res.Sends = append(res.Sends, httpapi.ScenarioSend{Worker: s.Worker, Fence: s.Fence})
	}
	res.Frozen, res.OK, res.Verdict = out.Frozen, out.Err == nil, out.Verdict
	if out.Err != nil {
		res.Verdict = out.Err.Error()
	}
	return res, nil
}
