package fencedpostgres_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedpostgres"
)

func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(ctxT(t), pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// holdAdvisory takes the advisory lock of key in a goroutine and keeps it
// until the returned function is called.
func holdAdvisory(t *testing.T, pool *pgxpool.Pool, key string) (release func()) {
	t.Helper()
	taken, done := make(chan struct{}), make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- fencedpostgres.WithAdvisoryLock(context.Background(), pool, key, nil, func(ctx context.Context, tx pgx.Tx) error {
			close(taken)
			<-done
			return nil
		})
	}()
	select {
	case <-taken:
	case err := <-errc:
		t.Fatalf("first holder: %v", err)
	}
	return func() {
		close(done)
		if err := <-errc; err != nil {
			t.Errorf("first holder: %v", err)
		}
	}
}

func TestAdvisoryLockSkipsWhenHeld(t *testing.T) {
	ctx := ctxT(t)
	pool := newPool(t)
	key := "advisory:skip:" + t.Name()
	release := holdAdvisory(t, pool, key)
	ran := false
	err := fencedpostgres.WithAdvisoryLock(ctx, pool, key, nil, func(context.Context, pgx.Tx) error { ran = true; return nil })
	if !errors.Is(err, fenced.ErrHeld) || ran {
		t.Fatalf("while held: err %v, ran %v; want ErrHeld and not run", err, ran)
	}
	// Another key is independent.
	if err := fencedpostgres.WithAdvisoryLock(ctx, pool, key+":other", nil, func(context.Context, pgx.Tx) error { return nil }); err != nil {
		t.Fatalf("another key: %v", err)
	}
	release()
	if err := fencedpostgres.WithAdvisoryLock(ctx, pool, key, nil, func(context.Context, pgx.Tx) error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("after the holder committed: err %v, ran %v", err, ran)
	}
}

func TestAdvisoryLockWaits(t *testing.T) {
	ctx := ctxT(t)
	pool := newPool(t)
	key := "advisory:wait:" + t.Name()
	release := holdAdvisory(t, pool, key)
	var released atomic.Bool
	time.AfterFunc(200*time.Millisecond, func() { released.Store(true); release() })
	err := fencedpostgres.WithAdvisoryLock(ctx, pool, key, &fencedpostgres.AdvisoryOptions{Wait: true}, func(context.Context, pgx.Tx) error {
		if !released.Load() {
			return errors.New("ran while the first holder still held the lock")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestAdvisoryLockMaxWaitAndCancel(t *testing.T) {
	ctx := ctxT(t)
	pool := newPool(t)
	key := "advisory:maxwait:" + t.Name()
	release := holdAdvisory(t, pool, key)
	defer release()
	fn := func(context.Context, pgx.Tx) error { return errors.New("ran while held") }
	err := fencedpostgres.WithAdvisoryLock(ctx, pool, key, &fencedpostgres.AdvisoryOptions{Wait: true, MaxWait: 200 * time.Millisecond}, fn)
	if !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("MaxWait ran out: %v, want ErrHeld", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	err = fencedpostgres.WithAdvisoryLock(cctx, pool, key, &fencedpostgres.AdvisoryOptions{Wait: true}, fn)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("context ended while waiting: %v, want DeadlineExceeded", err)
	}
	if err := fencedpostgres.WithAdvisoryLock(ctx, pool, key, &fencedpostgres.AdvisoryOptions{Wait: true, MaxWait: -time.Second}, fn); !errors.Is(err, fenced.ErrInvalidTTL) {
		t.Fatalf("negative MaxWait: %v", err)
	}
}

// The lock and the writes share one transaction: when fn fails, its writes
// are rolled back and the lock is free at once.
func TestAdvisoryLockSharesTheTransaction(t *testing.T) {
	ctx := ctxT(t)
	pool := newPool(t)
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS advisory_jobs; CREATE TABLE advisory_jobs (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	key := "advisory:tx:" + t.Name()
	boom := errors.New("boom")
	err := fencedpostgres.WithAdvisoryLock(ctx, pool, key, nil, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO advisory_jobs VALUES ('failed')`); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("fn's error came back as %v", err)
	}
	err = fencedpostgres.WithAdvisoryLock(ctx, pool, key, nil, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO advisory_jobs VALUES ('done')`)
		return err
	})
	if err != nil {
		t.Fatalf("lock not free after a failed fn: %v", err)
	}
	var ids []string
	rows, _ := pool.Query(ctx, `SELECT id FROM advisory_jobs ORDER BY id`)
	ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(ids) != 1 || ids[0] != "done" {
		t.Fatalf("rows %v, %v; want only the committed one", ids, err)
	}
}

// AdvisoryKey is computable in SQL (and so in any language) from the
// key's SHA-256.
func TestAdvisoryKeyMatchesSQL(t *testing.T) {
	ctx := ctxT(t)
	pool := newPool(t)
	for _, key := range []string{"invoice:inv_72", "billing-job", "ключ"} {
		var id int64
		err := pool.QueryRow(ctx, `SELECT ('x' || substr(encode(sha256(convert_to($1, 'UTF8')), 'hex'), 1, 16))::bit(64)::bigint`, key).Scan(&id)
		if err != nil {
			t.Fatal(err)
		}
		if got := fencedpostgres.AdvisoryKey(key); got != id {
			t.Errorf("AdvisoryKey(%q) = %d, SQL computes %d", key, got, id)
		}
	}
}
