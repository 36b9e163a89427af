package testenv

import (
	"fmt"
	"net/url"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// RedisConfig configures a redis-server started by StartRedis.
type RedisConfig struct {
	// Password, if set, is required from clients (requirepass) and used to
	// authenticate to the primary (masterauth).
	Password string
	// ReplicaOf, if set, makes the server a replica of that server.
	ReplicaOf *Redis
	// Port, if non-zero, is used instead of a fresh free port (to restart
	// a server on its old port).
	Port int
	// Dir, if set, is the data directory (to restart on old data).
	Dir string
	// NoPersistence turns the append-only file off (a server that loses
	// everything on restart).
	NoPersistence bool
}

// Redis is a redis-server started for a test.
type Redis struct {
	*Process
	Port   int
	Config RedisConfig
}

// Addr returns host:port.
func (r *Redis) Addr() string { return Addr(r.Port) }

// URL returns a redis:// URL for the server, with the password if any.
func (r *Redis) URL() string {
	u := url.URL{Scheme: "redis", Host: r.Addr(), Path: "/0"}
	if r.Config.Password != "" {
		u.User = url.UserPassword("", r.Config.Password)
	}
	return u.String()
}

// StartRedis starts redis-server on a free loopback port in a temporary
// directory, with the append-only file fsynced on every write (unless
// NoPersistence), and waits until it accepts connections. A replica also
// waits until its initial sync with the primary is done. The server is
// killed when the test ends.
func StartRedis(t testing.TB, cfg RedisConfig) *Redis {
	t.Helper()
	bin := RequireBinary(t, "redis-server", "redis-server")
	if cfg.Port == 0 {
		cfg.Port = FreePort(t)
	}
	if cfg.Dir == "" {
		cfg.Dir = TempDir(t, "redis")
	}
	args := []string{
		"--port", strconv.Itoa(cfg.Port), "--bind", "127.0.0.1", "--dir", cfg.Dir,
		"--save", "", "--daemonize", "no", "--protected-mode", "no", "--logfile", "",
		"--maxmemory-policy", "noeviction", "--repl-diskless-sync-delay", "0",
	}
	if cfg.NoPersistence {
		args = append(args, "--appendonly", "no")
	} else {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	}
	if cfg.Password != "" {
		args = append(args, "--requirepass", cfg.Password, "--masterauth", cfg.Password)
	}
	if cfg.ReplicaOf != nil {
		args = append(args, "--replicaof", "127.0.0.1", strconv.Itoa(cfg.ReplicaOf.Port))
	}
	r := &Redis{Port: cfg.Port, Config: cfg}
	r.Process = Start(t, fmt.Sprintf("redis-server:%d", cfg.Port), exec.Command(bin, args...))
	r.WaitLog(t, "Ready to accept connections", 20*time.Second)
	if cfg.ReplicaOf != nil {
		r.WaitLog(t, "MASTER <-> REPLICA sync: Finished with success", 20*time.Second)
	}
	return r
}

// Restart starts the server again on the same port and data directory
// after it was stopped or killed.
func (r *Redis) Restart(t testing.TB) *Redis {
	t.Helper()
	select {
	case <-r.Exited():
	default:
		t.Fatalf("testenv: restart of %s while it is still running", r.Name)
	}
	return StartRedis(t, r.Config)
}
