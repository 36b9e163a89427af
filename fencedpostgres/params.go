package fencedpostgres

import (
	"fmt"
	"net/url"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced-dev/fenced"
)

// serverSettings are the PostgreSQL settings a store URL may set as
// parameters of their own. pgx sends every parameter it does not know itself
// to the server as a setting. So a mistyped parameter (tabel=x) would reach
// the server, whose refusal looks like an outage. The URL therefore sets
// directly only the settings below: libpq's application_name,
// client_encoding and options, and those people put in connection strings.
// Any other one goes in options=-c NAME=VALUE, as with libpq.
var serverSettings = map[string]bool{
	"application_name":                    true,
	"client_encoding":                     true,
	"options":                             true,
	"search_path":                         true,
	"timezone":                            true,
	"datestyle":                           true,
	"intervalstyle":                       true,
	"statement_timeout":                   true,
	"lock_timeout":                        true,
	"idle_in_transaction_session_timeout": true,
	"idle_session_timeout":                true,
}

// checkParams refuses, before anything connects, the parameters of q
// (the URL's query without fenced's own) that pgx did not take as its own
// when it parsed them into cfg, unless they are serverSettings. Errors
// match fenced.ErrInvalidURL and name the parameter and what is accepted.
func checkParams(q url.Values, cfg *pgxpool.Config) error {
	var bad []string
	for k := range q {
		if _, sent := cfg.ConnConfig.RuntimeParams[k]; sent && !serverSettings[strings.ToLower(k)] {
			bad = append(bad, k)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	settings := make([]string, 0, len(serverSettings))
	for s := range serverSettings {
		settings = append(settings, s)
	}
	sort.Strings(settings)
	return fmt.Errorf(
		"%w: unknown parameter %q (fenced's: %s, %s; pgx.ParseConfig's, e.g. sslmode; settings: %s; other: options=-c NAME=VALUE)",
		fenced.ErrInvalidURL, bad[0], "table", paramNotify, strings.Join(settings, ", "))
}
