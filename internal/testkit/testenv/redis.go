package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
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
	// TLS serves TLS only, with a self-signed certificate made for the
	// test; URL then returns a rediss:// URL that skips verification.
	TLS bool
	// WallClock, if set, is the wall clock the server reads (PX expiry,
	// TIME), so a test can step it; nil is the host's clock.
	WallClock *WallClock
	// Host, if set, runs the server on that host of a Net, listening on
	// its address (for partitions at the packet level); nil is loopback.
	Host *NetHost
	// Binary, if set, is the server binary to run instead of RedisBinary's
	// (to replace a server by another version on its port and data).
	Binary string
}

// Redis is a redis-server started for a test.
type Redis struct {
	*Process
	Port   int
	Config RedisConfig
}

// Addr returns host:port.
func (r *Redis) Addr() string { return hostAddr(r.Config.Host, r.Port) }

// URL returns a redis:// URL for the server, with the password if any.
func (r *Redis) URL() string {
	u := url.URL{Scheme: "redis", Host: r.Addr(), Path: "/0"}
	if r.Config.TLS {
		u.Scheme, u.RawQuery = "rediss", "skip_verify=true"
	}
	if r.Config.Password != "" {
		u.User = url.UserPassword("", r.Config.Password)
	}
	return u.String()
}

// StartRedis starts redis-server on a free loopback port in a temporary
// directory. The append-only file is fsynced on every write (unless
// NoPersistence). It waits until the server accepts connections. A replica
// also waits until its initial sync with the primary is done. The server is
// killed when the test ends.
func StartRedis(t testing.TB, cfg RedisConfig) *Redis {
	t.Helper()
	bin := cfg.Binary
	if bin == "" {
		bin = RedisBinary(t)
	}
	if cfg.Port == 0 {
		cfg.Port = FreePort(t)
	}
	if cfg.Dir == "" {
		cfg.Dir = TempDir(t, "redis")
	}
	port := []string{"--port", strconv.Itoa(cfg.Port)}
	if cfg.TLS {
		cert, key := selfSignedCert(t, cfg.Dir)
		port = []string{"--port", "0", "--tls-port", strconv.Itoa(cfg.Port), "--tls-cert-file", cert, "--tls-key-file", key,
			"--tls-auth-clients", "no"}
	}
	args := []string{
		"--bind", hostIP(cfg.Host), "--dir", cfg.Dir,
		"--save", "", "--daemonize", "no", "--protected-mode", "no", "--logfile", "",
		"--maxmemory-policy", "noeviction", "--repl-diskless-sync-delay", "0",
	}
	args = append(args, port...)
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
	cmd := exec.Command(bin, args...)
	cfg.WallClock.Apply(cmd)
	r.Process = startServer(t, cfg.Host, fmt.Sprintf("redis-server:%d", cfg.Port), cmd)
	r.WaitLog(t, "Ready to accept connections", redisReadyTimeout)
	if cfg.ReplicaOf != nil {
		// Redis logs "MASTER <-> REPLICA sync: ...", Valkey "PRIMARY <-> REPLICA sync: ...".
		r.WaitLog(t, "<-> REPLICA sync: Finished with success", redisReadyTimeout)
	}
	return r
}

// redisReadyTimeout bounds the wait for a started server to be ready. It
// only catches a hang (a server that exits is seen at once), so it is
// generous: after a crash-restart in the long generative proof, a server
// with tens of thousands of keys took over 20 s to load its append-only
// file on a loaded machine.
const redisReadyTimeout = 2 * time.Minute

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

// selfSignedCert writes a certificate for 127.0.0.1 and its key into dir.
func selfSignedCert(t testing.TB, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "fenced test"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}
