package main

import (
	"fmt"
	"strings"
)

// peerReport is one published account of a lease system's limits, with
// the figures its reporters gave.
type peerReport struct {
	ref, url, figures string
}

// peerReports are the peers' own figures the report puts beside fenced's
// (read in the threads themselves; both etcd threads were closed as stale
// without a fix or a maintainer's figure).
var peerReports = []peerReport{
	{"jetcd#749", "https://github.com/etcd-io/jetcd/issues/749",
		"2020-05: jetcd's keepAlive on 25 000 leases (a real application, its reporter says); " +
			"from about 25 000 leases the count in `etcdctl lease list` declined and the client logged leases as already expired. " +
			"The keep-alive requests went out every 500 ms and got no response; the maintainer's guess: " +
			"refreshing them all takes longer than the TTL"},
	{"etcd#11886", "https://github.com/etcd-io/etcd/issues/11886",
		"2020-05, same reporter: Lease Grant and KeepAlive at 40 000 and 60 000 leases with a 20 s TTL on a 3-member etcd v3.4.5 " +
			"(8-core VMs, 200–300 % CPU): the number of leases declined steadily and the client logged them expired"},
	{"etcd#9360", "https://github.com/etcd-io/etcd/issues/9360",
		"2018-02: leases left to expire as key TTLs \"paralyzed\" a production 5-node etcd (8-CPU VMs) " +
			"at about 300–400 lease expirations per second, a rate it handles well over in puts and deletes; " +
			"p99 request time went \"through the roof\", requests timed out, and leases expired late (keys left with a negative TTL)"},
}

// writePeers writes the peers' figures beside fenced's measured renewal
// cost per lease (renewal rows of fenced, from this run).
func writePeers(w func(string, ...any), renewal []Row) {
	w("## Beside the peers' own figures\n\n")
	w("Lease systems with one server-side lease per lock pay per lease: one keep-alive (etcd's, jetcd's KeepAlive) or\n")
	w("one extend (redsync, redislock) per lease per renewal period, and one expiry per lease that is not released. Their\n")
	w("users have published where that breaks:\n\n")
	w("| report | what its reporters measured |\n| --- | --- |\n")
	for _, p := range peerReports {
		w("| [%s](%s) | %s |\n", p.ref, p.url, p.figures)
	}
	w("\n")
	var rows []string
	for _, r := range renewal {
		if r.Implementation != "fenced" || r.RequestsPerOp == 0 {
			continue
		}
		rows = append(rows, fmt.Sprintf("| %s | %v | %.0f | %s | %.4f |\n", r.Backend, r.Params["leases"],
			toF(r.Params["ttl_ms"])/1000, num(r.ServerCallsPerPeriod), r.RequestsPerOp))
	}
	if len(rows) > 0 {
		w("fenced batches renewals: one process renews all its leases with a few server calls per period (etcd: one\n")
		w("keep-alive of the one etcd lease the driver shares between every key with the same TTL, plus one listing of that\n")
		w("lease's keys; Redis: one script call per 256 grants). Measured in this run\n")
		w("(W4 above; requests counted by the server, per renewal period of TTL/3), against the 1.0 per lease per period of\n")
		w("a keep-alive or extend per lease:\n\n")
		w("| backend | leases held | TTL s | server requests/period | requests per lease per period |\n" +
			"| --- | ---: | ---: | ---: | ---: |\n")
		w("%s\n", strings.Join(rows, ""))
	}
	w("On etcd a fenced process keeps one etcd lease per TTL, whatever the number of fenced leases it holds, and its\n")
	w("requests per period are that session's work, not one per lease (W4 above: the per-lease figure falls as M grows).\n")
	w("At the 25 000–60 000 leases of jetcd#749 and etcd#11886 a per-lease keep-alive is 25 000–60 000 requests a period;\n")
	w("a fenced process that dies expires one etcd lease (etcd deletes its keys together), not one per key, so the\n")
	w("expiry rate of etcd#9360 takes hundreds of processes dying each second. A release is a delete, never an expiry.\n")
	w("These are the peers' figures on their hardware; this run did not reproduce their setups.\n\n")
}
