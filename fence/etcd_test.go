package fence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/fence/etcdfence"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// etcdKV stores a resource as two keys, RES/note and RES/status.
type etcdKV struct {
	g *etcdfence.Guard
	c *clientv3.Client
}

func (e etcdKV) claim(ctx context.Context, res string, t fence.Token) (fence.Result, error) {
	return e.g.Claim(ctx, res, t)
}

func (e etcdKV) put(ctx context.Context, res string, t fence.Token, note, ifStatus, newStatus string) (fence.Result, error) {
	w := etcdfence.Write{Then: []clientv3.Op{clientv3.OpPut(res+"/note", note)}}
	if ifStatus != "" {
		w.If = []clientv3.Cmp{clientv3.Compare(clientv3.Value(res+"/status"), "=", ifStatus)}
		w.Then = append(w.Then, clientv3.OpPut(res+"/status", newStatus))
	}
	return e.g.Write(ctx, res, t, w)
}

func (e etcdKV) setStatus(ctx context.Context, res string, t fence.Token, status string) error {
	_, err := e.g.Write(ctx, res, t, etcdfence.Write{Then: []clientv3.Op{clientv3.OpPut(res+"/status", status)}})
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
	runKVGuardTests(t, func(t *testing.T, o kvOpts) kvGuard {
		g, err := etcdfence.New(c, &etcdfence.Options{Hook: o.hooks, Check: o.check, LeaseKey: o.leaseKey})
		if err != nil {
			t.Fatal(err)
		}
		return etcdKV{g, c}
	})
	t.Run("BadInput", func(t *testing.T) {
		ctx := context.Background()
		g, _ := etcdfence.New(c, nil)
		c.Put(ctx, g.FenceKey("corrupt"), "-3")
		if _, err := g.Write(ctx, "corrupt", tok(5, "o"), etcdfence.Write{Then: []clientv3.Op{clientv3.OpPut("corrupt/note", "y")}}); !errors.Is(err, fence.ErrSchema) {
			t.Errorf("corrupt fence key: %v", err)
		}
		if r, _ := c.Get(ctx, "corrupt/note"); len(r.Kvs) != 0 {
			t.Error("write applied despite a corrupt fence key")
		}
		if _, err := g.Claim(ctx, "", tok(5, "o")); err == nil {
			t.Error("empty resource accepted")
		}
		if _, err := etcdfence.New(nil, nil); err == nil {
			t.Error("nil client accepted")
		}
		c.Put(ctx, g.FenceKey("badkey"), "\n00000000000000000005 o")
		if _, err := g.Claim(ctx, "badkey", tok(6, "o")); !errors.Is(err, fence.ErrSchema) {
			t.Errorf("fence key bound to an empty lease key: %v", err)
		}
	})

	// A fence key written before lease keys were recorded ("fence owner"):
	// the next admitted write binds it, replacing exactly that value, and
	// then other keys are refused.
	t.Run("UnboundFenceKey", func(t *testing.T) {
		ctx := context.Background()
		g, _ := etcdfence.New(c, nil)
		fk := g.FenceKey("legacy")
		legacy := "00000000000000000005 o5"
		c.Put(ctx, fk, legacy)
		note := func(text string) etcdfence.Write {
			return etcdfence.Write{Then: []clientv3.Op{clientv3.OpPut("legacy/note", text)}}
		}
		if r, err := g.Write(ctx, "legacy", fence.Token{Key: "invoice:1", Fence: 4, Owner: "o4"}, note("stale")); err != nil || r.Outcome != fence.Stale || r.Current != 5 {
			t.Fatalf("older fence on an unbound fence key: %+v %v", r, err)
		}
		if r, err := g.Write(ctx, "legacy", fence.Token{Key: "invoice:1", Fence: 5, Owner: "other"}, note("same fence")); err != nil || !r.SameFenceOtherOwner {
			t.Fatalf("equal fence, other owner, on an unbound fence key: %+v %v", r, err)
		}
		cond := etcdfence.Write{If: []clientv3.Cmp{clientv3.Compare(clientv3.Value("legacy/status"), "=", "PENDING")}, Then: note("cond").Then}
		if r, err := g.Write(ctx, "legacy", fence.Token{Key: "invoice:1", Fence: 6, Owner: "o6"}, cond); err != nil || r.Outcome != fence.PreconditionFailed {
			t.Fatalf("newer fence whose precondition fails: %+v %v", r, err)
		}
		if r, _ := c.Get(ctx, fk); string(r.Kvs[0].Value) != legacy {
			t.Fatalf("writes that did not apply changed the fence key to %q", r.Kvs[0].Value)
		}
		if r, err := g.Write(ctx, "legacy", fence.Token{Key: "invoice:1", Fence: 6, Owner: "o6"}, note("y")); err != nil || !r.Applied() {
			t.Fatalf("newer fence on an unbound fence key: %+v %v", r, err)
		}
		if r, _ := c.Get(ctx, fk); string(r.Kvs[0].Value) != "invoice:1\n00000000000000000006 o6" {
			t.Fatalf("fence key holds %q after binding", r.Kvs[0].Value)
		}
		if _, err := g.Write(ctx, "legacy", fence.Token{Key: "batch:all", Fence: 900, Owner: "b"}, note("z")); !errors.Is(err, fence.ErrWrongKey) {
			t.Fatalf("other key after binding: %v", err)
		}
		if f, o, err := g.Current(ctx, "legacy"); err != nil || f != 6 || o != "o6" {
			t.Fatalf("Current = %d %q %v", f, o, err)
		}
	})
}
