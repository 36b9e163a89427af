package fencedetcd_test

import (
	"net/url"
	"testing"

	"github.com/fenced-dev/fenced/internal/testkit/opentest"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestPrefixNames opens stores with key prefixes etcd takes (any bytes
// but NUL), which must be used. Prefixes the backend refuses must be
// refused before connecting.
func TestPrefixNames(t *testing.T) {
	cluster := testenv.StartEtcd(t)
	opentest.Names{
		What:     "prefix",
		Accepted: []string{"fenced/", "app-locks/", "a b/", "ü/", "no-slash"},
		URL:      func(p string) string { return cluster.URL("prefix=" + url.QueryEscape(p)) },
		Refused: []opentest.BadName{
			{Name: "", Says: "prefix is empty"},
			{Name: "a\x00b", Says: "NUL"},
		},
		BadURL: func(p string) string { return "etcd://127.0.0.1:1/?prefix=" + url.QueryEscape(p) },
	}.Check(t)
}
