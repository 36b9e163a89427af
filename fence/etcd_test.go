package fence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/internal/testenv"
)

// etcdKV stores a resource as two keys, RES/note and RES/status.
type etcdKV struct {
	g *fence.Etcd
	c *clientv3.Client
}

func (e etcdKV) claim(ctx context.Context, res string, t fence.Token) (fence.Result, error) {
	return e.g.Claim(ctx, res, t)
}

func (e etcdKV) put(ctx context.Context, res string, t fence.Token, note, ifStatus, newStatus string) (fence.Result, error) {
	w := fence.EtcdWrite{Then: []clientv3.Op{clientv3.OpPut(res+"/note", note)}}
	if ifStatus != "" {
		w.If = []clientv3.Cmp{clientv3.Compare(clientv3.Value(res+"/status"), "=", ifStatus)}
		w.Then = append(w.Then, clientv3.OpPut(res+"/status", newStatus))
	}
	return e.g.Write(ctx, res, t, w)
}

func (e etcdKV) setStatus(ctx context.Context, res string, t fence.Token, status string) error {
	_, err := e.g.Write(ctx, res, t, fence.EtcdWrite{Then: []clientv3.Op{clientv3.OpPut(res+"/status", status)}})
	return err
}

func (e etcdKV) get(ctx context.Context, k string) string {
	r, err := e.c.Get(ctx, k)
	if err != nil || len(r.Kvs) == 0 {
		return ""
	}
	return string(r.Kvs[0].Value)
}

func (e etcdKV) note(ctx context.Context, res string) string   { return e.get(ctx, res+"/note") }
func (e etcdKV) status(ctx context.Context, res string) string { return e.get(ctx, res+"/status") }

func (e etcdKV) current(ctx context.Context, res string) (uint64, string) {
	f, o, err := e.g.Current(ctx, res)
	if err != nil {
		panic(err)
	}
	return f, o
}

func TestEtcdGuard(t *testing.T) {
	t.Parallel()
	cluster := testenv.StartEtcd(t)
	c, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	runKVGuardTests(t, func(t *testing.T, hooks fenced.Hooks) kvGuard {
		g, err := fence.NewEtcd(c, &fence.EtcdOptions{Hooks: hooks})
		if err != nil {
			t.Fatal(err)
		}
		return etcdKV{g, c}
	})
	t.Run("BadInput", func(t *testing.T) {
		ctx := context.Background()
		g, _ := fence.NewEtcd(c, nil)
		c.Put(ctx, g.FenceKey("corrupt"), "-3")
		if _, err := g.Write(ctx, "corrupt", tok(5, "o"), fence.EtcdWrite{Then: []clientv3.Op{clientv3.OpPut("corrupt/note", "y")}}); !errors.Is(err, fence.ErrSchema) {
			t.Errorf("corrupt fence key: %v", err)
		}
		if r, _ := c.Get(ctx, "corrupt/note"); len(r.Kvs) != 0 {
			t.Error("write applied despite a corrupt fence key")
		}
		if _, err := g.Claim(ctx, "", tok(5, "o")); err == nil {
			t.Error("empty resource accepted")
		}
		if _, err := fence.NewEtcd(nil, nil); err == nil {
			t.Error("nil client accepted")
		}
	})
}
