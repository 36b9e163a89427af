package fencedredlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/redis/go-redis/v9"
)

// makeBusy runs a Lua script that never ends on srv, so that the server
// answers every other command with a BUSY error, and returns once it does.
// The returned function ends the script (SCRIPT KILL) and waits until the
// server answers normally again.
func makeBusy(t *testing.T, srv *testenv.Redis) (end func()) {
	t.Helper()
	ctx := ctxT(t)
	admin := client(t, srv)
	if err := admin.ConfigSet(ctx, "busy-reply-threshold", "20").Err(); err != nil {
		t.Fatal(err)
	}
	// The script's own connection must wait as long as the script runs.
	runner := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: password, MaxRetries: -1, ReadTimeout: -1})
	t.Cleanup(func() { runner.Close() })
	ran := make(chan error, 1)
	go func() { ran <- runner.Eval(context.Background(), "while true do end", nil).Err() }()
	for {
		err := admin.Ping(ctx).Err()
		if err != nil && strings.HasPrefix(err.Error(), "BUSY") {
			break
		}
		if err := ctx.Err(); err != nil {
			t.Fatalf("%s never answered BUSY (last reply: %v)", srv.Addr(), err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return func() {
		t.Helper()
		if err := admin.ScriptKill(ctx).Err(); err != nil {
			t.Fatalf("SCRIPT KILL on %s: %v", srv.Addr(), err)
		}
		if err := <-ran; err == nil || !strings.Contains(err.Error(), "killed") {
			t.Fatalf("busy script on %s ended with %v, want killed", srv.Addr(), err)
		}
		if err := admin.Ping(ctx).Err(); err != nil {
			t.Fatalf("%s after SCRIPT KILL: %v", srv.Addr(), err)
		}
	}
}

// TestServerErrorsAreNotRefusals makes a majority of nodes answer BUSY (a
// script runs past busy-reply-threshold) while grants are renewed. A BUSY
// (like LOADING or OOM) reply refuses the command before it runs and says
// nothing about the grant, so neither Renew nor RenewBatch may report it as
// ErrNotHeld, which ends a lease for good: both must report the same
// retryable outcome, and once the nodes answer again a renewal keeps every
// grant.
func TestServerErrorsAreNotRefusals(t *testing.T) {
	ctx := ctxT(t)
	c := startCluster(t, 3)
	opts := c.fenced(t)
	opts.Budget = 2 * time.Second // generous for a loaded machine under -race
	d := c.open(t, c.nodes, opts)
	var grants []driver.Grant
	for i := 0; i < 4; i++ {
		key := "busy:" + string(rune('a'+i))
		o := owner()
		f, err := d.TryAcquire(ctx, key, o, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		grants = append(grants, driver.Grant{Key: key, Owner: o, Fence: f, TTL: time.Minute})
	}
	// One renewal while every node answers: the scripts are loaded, so
	// what follows exercises the BUSY replies, not script loading.
	renewAll := func(when string) {
		t.Helper()
		errs, err := d.RenewBatch(ctx, grants)
		if err != nil {
			t.Fatalf("renew batch %s: %v", when, err)
		}
		for i, e := range errs {
			if e != nil {
				t.Fatalf("renew batch %s: grant %d: %v", when, i, e)
			}
		}
	}
	renewAll("before")

	end0, end1 := makeBusy(t, c.nodes[0]), makeBusy(t, c.nodes[1])
	single := d.Renew(ctx, grants[0])
	errs, err := d.RenewBatch(ctx, grants)
	end0()
	end1()

	t.Logf("single renewal with 2 of 3 nodes BUSY: %v", single)
	if single == nil || errors.Is(single, fenced.ErrNotHeld) || !errors.Is(single, fenced.ErrUnavailable) {
		t.Errorf("Renew with 2 of 3 nodes BUSY: %v, want ErrUnavailable and not ErrNotHeld", single)
	}
	if err != nil {
		t.Fatalf("RenewBatch with 2 of 3 nodes BUSY: %v, want one result per grant", err)
	}
	for i, e := range errs {
		if e == nil || errors.Is(e, fenced.ErrNotHeld) || !errors.Is(e, fenced.ErrUnavailable) {
			t.Errorf("RenewBatch with 2 of 3 nodes BUSY: grant %d: %v, want ErrUnavailable and not ErrNotHeld", i, e)
		}
		for _, sentinel := range []error{fenced.ErrNotHeld, fenced.ErrUnavailable, fenced.ErrUnknownOutcome} {
			if errors.Is(e, sentinel) != errors.Is(single, sentinel) {
				t.Errorf("grant %d: RenewBatch said %v but Renew said %v: they disagree on %v", i, e, single, sentinel)
			}
		}
	}
	renewAll("after the nodes answer again")
	for _, g := range grants {
		info, err := d.Inspect(ctx, g.Key)
		if err != nil || !info.Held || info.Fence != g.Fence {
			t.Fatalf("%s after the BUSY spell: %+v, %v; want still held with fence %d", g.Key, info, err, g.Fence)
		}
	}
}
