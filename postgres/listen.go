package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced/driver/wakeup"
	"github.com/jackc/pgx/v5"
)

// probePayload is the payload of the startup probe notification. Keys are
// never empty, so it cannot be mistaken for a release.
const probePayload = ""

// listener keeps the driver's one LISTEN connection and fans notifications
// out by key: a release of key K wakes only the subscriptions to K.
type listener struct {
	d   *Driver
	cfg *pgx.ConnConfig

	wake  wakeup.Registry // waiters by key
	probe chan struct{}   // signalled on a probe payload

	cancel context.CancelFunc
	done   chan struct{}
}

// startListener connects, LISTENs, and proves that a notification sent
// through the driver's pool reaches the listening connection within
// timeout (it would not behind a transaction-mode pooler). Then it serves
// notifications until close.
func startListener(ctx context.Context, d *Driver, cfg *pgx.ConnConfig, timeout time.Duration) (*listener, error) {
	l := &listener{d: d, cfg: cfg, probe: make(chan struct{}, 1), done: make(chan struct{})}
	conn, err := l.connect(ctx)
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	go l.run(lctx, conn)
	if _, err := d.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, d.channel, probePayload); err != nil {
		l.close()
		return nil, fmt.Errorf("probe notification: %w", err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-l.probe:
		return l, nil
	case <-t.C:
		l.close()
		return nil, fmt.Errorf("a probe notification sent through the pool did not reach the LISTEN connection within %v", timeout)
	case <-ctx.Done():
		l.close()
		return nil, ctx.Err()
	}
}

func (l *listener) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, l.cfg)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+quoteIdent(l.d.channel)); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}

// run delivers notifications, and reconnects (with backoff) when the
// connection breaks. After a reconnect every subscription is woken, since
// releases may have been missed while it was down.
func (l *listener) run(ctx context.Context, conn *pgx.Conn) {
	defer close(l.done)
	backoff := 50 * time.Millisecond
	for {
		for conn == nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			c, err := l.connect(ctx)
			if err == nil {
				conn = c
				backoff = 50 * time.Millisecond
				l.wake.WakeEvery()
			}
		}
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			conn.Close(context.Background())
			conn = nil
			if ctx.Err() != nil {
				return
			}
			// Waiters keep their fallback timers while the connection is
			// re-established; wake them so they check once now.
			l.wake.WakeEvery()
			continue
		}
		if n.Payload == probePayload {
			select {
			case l.probe <- struct{}{}:
			default:
			}
			continue
		}
		l.wake.Wake(n.Payload)
	}
}

func (l *listener) close() {
	l.cancel()
	<-l.done
}

func (l *listener) subscribe(key string) *wakeup.Sub { return l.wake.Subscribe(key) }
