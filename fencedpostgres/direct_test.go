package fencedpostgres_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced/internal/core/capability"

	"github.com/fenced-dev/fenced/fencedpostgres"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// A driver whose pool does not reach the server directly (the server sees
// another client port) does not LISTEN unless notify=on says to: behind a
// transaction-mode pooler the LISTEN would stay on a shared server
// connection, whose notifications then crash PgBouncer 1.18 when they
// meet a cancelled query. Directly, and through a TCP proxy with
// notify=on, waiters are woken by notification.
func TestListenOnlyOnADirectConnection(t *testing.T) {
	direct := open(t, "table=direct_leases")
	if !capability.Of(direct).Notifies() {
		t.Fatalf("direct connection: Notify=false (%s)", direct.Capabilities().Note)
	}

	proxy := testenv.StartProxy(t, testenv.Addr(pg.Port))
	u, err := url.Parse(pg.URL("table=direct_leases"))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = proxy.Addr
	for _, c := range []struct {
		param  string
		notify bool
	}{{"", false}, {"&notify=on", true}} {
		d, err := fencedpostgres.Open(ctxT(t), u.String()+c.param)
		if err != nil {
			t.Fatal(err)
		}
		g, notified := d.Capabilities(), capability.Of(d).Notifies()
		d.Close()
		if notified != c.notify {
			t.Errorf("through a TCP proxy%s: Notify=%v, want %v (%s)", c.param, notified, c.notify, g.Note)
		}
		if !c.notify && !strings.Contains(g.Note, "a pooler or proxy is in between") {
			t.Errorf("through a TCP proxy: the note does not say why LISTEN is off: %s", g.Note)
		}
	}
}
