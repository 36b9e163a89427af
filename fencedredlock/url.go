package fencedredlock

// URL opening: redlock://host:port,host:port,...

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
	"github.com/redis/go-redis/v9"
)

func open(ctx context.Context, u *url.URL) (driver.Driver, error) {
	hosts := strings.Split(u.Host, ",")
	if u.Host == "" || len(hosts) == 0 {
		return nil, fmt.Errorf("%w: redlock URL needs hosts, as in redlock://h1:6379,h2:6379,h3:6379/0", fenced.ErrInvalidURL)
	}
	for _, h := range hosts {
		host, port, err := splitHostPort(h)
		if err != nil {
			return nil, fmt.Errorf("%w: redlock host %q: %v", fenced.ErrInvalidURL, h, err)
		}
		_, _ = host, port
	}
	q := rediskit.TakeQuery(u, "prefix", "budget", "fence", "audit_len")
	opts := &Options{Prefix: q.Prefix(""), Budget: q.Duration("budget", 0), AuditLen: q.Int("audit_len", 0)}
	if err := q.Err(); err != nil {
		return nil, err
	}
	var clients []redis.UniversalClient
	closeAll := func() {
		for _, c := range clients {
			c.Close()
		}
	}
	for _, h := range hosts {
		nu := *u
		nu.Scheme, nu.Host = "redis", h
		ro, err := rediskit.ClientOptions(&nu)
		if err != nil {
			closeAll()
			return nil, err
		}
		clients = append(clients, redis.NewClient(ro))
	}
	// Every node must answer (and accept the password) at open time, so a
	// typo is reported at once; later, a minority may be down.
	var errs []error
	for _, c := range clients {
		o := c.(*redis.Client).Options()
		if err := rediskit.Ping(ctx, c, o.Addr, o.DialTimeout+2*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > len(clients)-(len(clients)/2+1) {
		closeAll()
		return nil, fmt.Errorf("redlock: fewer than a majority of %d nodes usable: %w", len(clients), errors.Join(errs...))
	}
	if f := q.String("fence", ""); f != "" {
		fc, err := fenced.Open(ctx, f, nil)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("redlock: fence source: %w", err)
		}
		opts.Fence = ClientFence(fc)
	}
	d, err := New(clients, opts)
	if err != nil {
		closeAll()
		return nil, err
	}
	d.owns = true
	return d, nil
}

func splitHostPort(h string) (string, string, error) {
	if h == "" {
		return "", "", errors.New("empty host")
	}
	i := strings.LastIndexByte(h, ':')
	if i < 0 {
		return h, "", nil
	}
	host, port := h[:i], h[i+1:]
	if host == "" {
		return "", "", errors.New("empty host")
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return "", "", fmt.Errorf("port %q is not a TCP port", port)
	}
	return host, port, nil
}
