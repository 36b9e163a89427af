package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

func TestPlan(t *testing.T) {
	t.Parallel()
	// etcd rounds the TTL to whole seconds and adds a second of session;
	// plan does not connect to the store (nothing listens on port 1).
	r := cli(t, "etcd://127.0.0.1:1", "plan", "--ttl", "1500ms")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	for _, re := range []string{`authority keeps:\s+3s`, `freeze absorbed:\s+983ms`, `recovery after a crash:\s+2.5s to 3.5s`, `whole seconds`, `--max-pause`} {
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("output lacks %q:\n%s", re, r.stdout)
		}
	}

	r = cli(t, tempStore(t), "plan", "--ttl", "30s", "--max-pause", "45s", "-o", "json")
	var p struct {
		StaleWindowMS    int64    `json:"stale_window_ms"`
		RecommendedTTLMS int64    `json:"recommended_ttl_ms"`
		Advice           []string `json:"advice"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &p); err != nil || r.code != 0 {
		t.Fatalf("exit %d, %v: %s%s", r.code, err, r.stdout, r.stderr)
	}
	if p.StaleWindowMS != 25000 || p.RecommendedTTLMS != 69000 || !strings.Contains(strings.Join(p.Advice, " "), "measured") {
		t.Fatalf("plan for a 45s pause on a 30s TTL: %+v", p)
	}

	for _, args := range [][]string{{"plan", "--ttl", "1ms"}, {"plan", "--renew-every", "40s"}, {"plan", "--max-pause", "-1s"}} {
		if r := cli(t, tempStore(t), args...); r.code != exitUsage || !strings.Contains(r.stderr, "plan") {
			t.Errorf("%v: exit %d (want %d), stderr %q", args, r.code, exitUsage, r.stderr)
		}
	}
}
