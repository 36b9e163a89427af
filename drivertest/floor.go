package drivertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/capability"
	"github.com/fenced-dev/fenced/internal/core/limits"
)

// FloorHarness tells RunFloorTests how to reach the store under test.
type FloorHarness struct {
	// OpenTable returns a new driver on the named lease table of the store
	// under test, creating it if needed, as another process would. The
	// driver must implement driver.FenceFloorer. The
	// suite closes what it opens.
	OpenTable func(t *testing.T, table string) driver.Driver
}

// RunFloorTests runs the tests of fence floors and pruning as subtests of t,
// each on tables of its own. A floor lifts every key's next fence, never
// goes down, and seeds a new table above an old one. A prune keeps every
// key's fences increasing, also while grants race with it.
func RunFloorTests(t *testing.T, h FloorHarness) {
	s := &floorSuite{h: h}
	t.Run("RaiseLiftsEveryKeyAndNeverLowers", s.testRaise)
	t.Run("SeedNewTableAboveOld", s.testSeed)
	t.Run("PruneKeepsFencesIncreasing", s.testPrune)
	t.Run("PruneManyKeys", s.testPruneMany)
	t.Run("PruneRacingGrantsNeverReissues", s.testPruneRace)
	t.Run("BadInput", s.testBadInput)
}

type floorSuite struct{ h FloorHarness }

// floorDriver is what the suite needs of a driver.
type floorDriver struct {
	driver.Driver
	driver.FenceFloorer
}

// newTable returns a table name no other test (or earlier run against a
// durable store) has used.
func newTable() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "floor_" + hex.EncodeToString(b[:])
}

func (s *floorSuite) open(t *testing.T, table string) floorDriver {
	t.Helper()
	d := s.h.OpenTable(t, table)
	t.Cleanup(func() { d.Close() })
	ops := capability.Of(d)
	if ops.FenceFloorer == nil {
		t.Fatalf("%T does not declare and implement driver.FenceFloorer (Capabilities.FenceFloor)", d)
	}
	return floorDriver{d, ops.FenceFloorer}
}

// grant acquires key for a fresh owner and fails the test unless granted.
func grant(t *testing.T, d driver.Driver, key string, ttl time.Duration) driver.Grant {
	t.Helper()
	o := owner()
	f, err := d.TryAcquire(Context(t), key, o, ttl)
	if err != nil {
		t.Fatalf("acquire %s: %v", key, err)
	}
	return driver.Grant{Key: key, Owner: o, Fence: f, TTL: ttl}
}

// cycle grants key and releases it, returning the fence.
func cycle(t *testing.T, d driver.Driver, key string) uint64 {
	t.Helper()
	g := grant(t, d, key, time.Minute)
	if err := d.Release(Context(t), g); err != nil {
		t.Fatalf("release %v: %v", g, err)
	}
	return g.Fence
}

func (s *floorSuite) testRaise(t *testing.T) {
	ctx := Context(t)
	table := newTable()
	d := s.open(t, table)
	if floor, maxFence, err := d.FenceFloor(ctx); err != nil || floor != 0 || maxFence != 0 {
		t.Fatalf("FenceFloor of a new table = %d, %d, %v; want zero", floor, maxFence, err)
	}
	old := cycle(t, d, "k:old")
	held := grant(t, d, "k:held", time.Minute)
	if got, err := d.RaiseFenceFloor(ctx, 100); err != nil || got != 100 {
		t.Fatalf("RaiseFenceFloor(100) = %d, %v", got, err)
	}
	if got, err := d.RaiseFenceFloor(ctx, 50); err != nil || got != 100 {
		t.Fatalf("RaiseFenceFloor(50) after 100 = %d, %v; a floor never goes down", got, err)
	}
	if floor, maxFence, err := d.FenceFloor(ctx); err != nil || floor != 100 || maxFence != max(old, held.Fence) {
		t.Fatalf("FenceFloor = %d, %d, %v; want floor 100, max fence %d", floor, maxFence, err, max(old, held.Fence))
	}
	// The holder's own re-acquire keeps its grant and fence.
	if f, err := d.TryAcquire(ctx, held.Key, held.Owner, time.Minute); err != nil || f != held.Fence {
		t.Fatalf("re-acquire by the holder after a raise = %d, %v; want its fence %d", f, err, held.Fence)
	}
	if err := d.Renew(ctx, held); err != nil {
		t.Fatalf("renew after a raise: %v", err)
	}
	// Existing and new keys alike start above the floor.
	if f := cycle(t, d, "k:old"); f <= 100 {
		t.Fatalf("existing key after raising the floor to 100: fence %d", f)
	}
	if f := cycle(t, d, "k:new"); f <= 100 {
		t.Fatalf("new key after raising the floor to 100: fence %d", f)
	}
	// Another connection sees the same floor.
	if f := cycle(t, s.open(t, table), "k:other"); f <= 100 {
		t.Fatalf("new key through another connection: fence %d", f)
	}
}

// Moving keys to a new table (or store) restarts their counters; seeding
// the new table's floor with the old one's highest fence keeps every key
// above what its resources have seen.
func (s *floorSuite) testSeed(t *testing.T) {
	ctx := Context(t)
	oldT := s.open(t, newTable())
	var last uint64
	for range 3 {
		last = cycle(t, oldT, "k:moved")
	}
	floor, maxFence, err := oldT.FenceFloor(ctx)
	if err != nil || maxFence != last {
		t.Fatalf("FenceFloor of the old table = %d, %d, %v; want max fence %d", floor, maxFence, err, last)
	}
	unseeded := s.open(t, newTable())
	if f := cycle(t, unseeded, "k:moved"); f > last {
		t.Fatalf("a new table without a floor gave fence %d; the test assumes counters restart", f)
	}
	seeded := s.open(t, newTable())
	if _, err := seeded.RaiseFenceFloor(ctx, max(floor, maxFence)); err != nil {
		t.Fatal(err)
	}
	if f := cycle(t, seeded, "k:moved"); f <= last {
		t.Fatalf("seeded table gave fence %d, not above the old table's %d", f, last)
	}
}

func (s *floorSuite) testPrune(t *testing.T) {
	ctx := Context(t)
	d := s.open(t, newTable())
	fences := map[string]uint64{}
	for _, k := range []string{"k:a", "k:b", "k:c"} {
		for range 2 {
			fences[k] = cycle(t, d, k)
		}
	}
	expired := grant(t, d, "k:expired", 50*time.Millisecond)
	held := grant(t, d, "k:held", time.Minute)
	// Expired by any server's clock, and its release time (where the
	// store records one) in the past.
	time.Sleep(300 * time.Millisecond)

	deleted, floor, err := d.Prune(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if deleted != 4 || floor < max(fences["k:a"], fences["k:b"], fences["k:c"], expired.Fence) {
		t.Fatalf("Prune(0) = %d deleted, floor %d; want 4 deleted and a floor of at least every deleted fence (%v, expired %d)",
			deleted, floor, fences, expired.Fence)
	}
	for _, k := range []string{"k:a", "k:b", "k:c", "k:expired"} {
		if _, err := d.Inspect(ctx, k); !errors.Is(err, fenced.ErrNotFound) {
			t.Errorf("Inspect(%s) after prune: %v, want ErrNotFound", k, err)
		}
	}
	if info, err := d.Inspect(ctx, held.Key); err != nil || !info.Held || info.Fence != held.Fence {
		t.Fatalf("the held key after prune: %+v, %v", info, err)
	}
	if err := d.Renew(ctx, held); err != nil {
		t.Fatalf("renew of the held key after prune: %v", err)
	}
	if err := d.Renew(ctx, expired); !errors.Is(err, fenced.ErrNotHeld) {
		t.Fatalf("renew of a pruned grant: %v, want ErrNotHeld", err)
	}
	for k, f := range fences {
		if g := cycle(t, d, k); g <= f || g <= floor {
			t.Errorf("%s after prune: fence %d, want above its old %d and the floor %d", k, g, f, floor)
		}
	}
	if g := grant(t, d, expired.Key, time.Minute); g.Fence <= expired.Fence {
		t.Errorf("%s after prune: fence %d, want above %d", expired.Key, g.Fence, expired.Fence)
	}
	// With an hour's age, held keys stay and the floor never goes down.
	// Stores that keep no release time (MySQL, SQLite) delete the three
	// keys released just now, others keep them.
	deleted2, floor2, err := d.Prune(ctx, time.Hour)
	if err != nil || floor2 < floor || (deleted2 != 0 && deleted2 != 3) {
		t.Fatalf("Prune(1h) = %d deleted, floor %d, %v; want 0 or 3 deleted, floor at least %d", deleted2, floor2, err, floor)
	}
	for _, k := range []string{held.Key, expired.Key} {
		if info, err := d.Inspect(ctx, k); err != nil || !info.Held {
			t.Errorf("held key %s after Prune(1h): %+v, %v", k, info, err)
		}
	}
}

// A prune of more keys than one batch deletes every one of them, and
// raises the floor to the highest fence among them.
func (s *floorSuite) testPruneMany(t *testing.T) {
	// A hang bound, not a speed one: 1207 SQLite grants (an fsync each)
	// took over a minute beside the hog (hog7).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d := s.open(t, newTable())
	// More than two batches of the SQL stores; few writers, since SQLite
	// serves one at a time and does not queue them fairly.
	const keys, workers = 1207, 3
	var (
		wg      sync.WaitGroup
		highest atomic.Uint64
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < keys; i += workers {
				f, err := d.TryAcquire(ctx, fmt.Sprintf("many:%04d", i), owner(), 50*time.Millisecond)
				if err != nil {
					t.Errorf("acquire: %v", err)
					return
				}
				for h := highest.Load(); f > h && !highest.CompareAndSwap(h, f); h = highest.Load() {
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	held := grant(t, d, "many:held", time.Minute)
	time.Sleep(300 * time.Millisecond)
	deleted, floor, err := d.Prune(ctx, 0)
	if err != nil || deleted != int64(keys) || floor < highest.Load() {
		t.Fatalf("Prune(0) = %d deleted, floor %d, %v; want %d deleted, floor at least %d", deleted, floor, err, keys, highest.Load())
	}
	if infos, err := d.List(ctx, "many:"); err != nil || len(infos) != 1 || infos[0].Key != held.Key {
		t.Fatalf("after prune List = %+v, %v; want only %s", infos, err, held.Key)
	}
	if g := grant(t, d, "many:0000", time.Minute); g.Fence <= floor {
		t.Fatalf("a pruned key again: fence %d, want above the floor %d", g.Fence, floor)
	}
}

// A prune that races with grants of the keys it deletes must never let a
// grant reissue a fence: each key's fences, recorded while it is held,
// strictly increase.
func (s *floorSuite) testPruneRace(t *testing.T) {
	ctx := Context(t)
	table := newTable()
	keys := []string{"race:a", "race:b", "race:c"}
	// Not skipped with -short either: the suite skips nothing but
	// undeclared capabilities.
	const workers, grantsPerWorker = 4, 60
	var (
		mu      sync.Mutex
		history = map[string][]uint64{}
		pruned  atomic.Int64
		stop    = make(chan struct{})
		pruner  sync.WaitGroup
	)
	pd := s.open(t, table)
	pruner.Add(1)
	go func() {
		defer pruner.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			deleted, _, err := pd.Prune(ctx, 0)
			if err != nil {
				t.Errorf("prune: %v", err)
				return
			}
			pruned.Add(deleted)
			// Often, but not back to back: a store with one writer at a
			// time (SQLite) would otherwise keep grants waiting.
			time.Sleep(2 * time.Millisecond)
		}
	}()
	raceDeadline := time.Now().Add(10 * time.Second)
	var unavailable atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		d := s.open(t, table)
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Past grantsPerWorker, go on until a prune has deleted
			// something (a fast store can finish before the pruner's first
			// pass), for at most raceDeadline.
			for i := 0; i < grantsPerWorker || (pruned.Load() == 0 && time.Now().Before(raceDeadline)); {
				key := keys[(w+i)%len(keys)]
				o := owner()
				f, err := d.TryAcquire(ctx, key, o, time.Minute)
				if errors.Is(err, fenced.ErrHeld) {
					time.Sleep(time.Millisecond)
					continue
				}
				if errors.Is(err, fenced.ErrUnavailable) && time.Now().Before(raceDeadline.Add(time.Minute)) {
					// A store with one writer at a time (SQLite) gives up
					// after its busy timeout when writers starve, as the
					// Client would retry, so does this worker.
					unavailable.Add(1)
					continue
				}
				if err != nil {
					t.Errorf("acquire %s: %v", key, err)
					return
				}
				mu.Lock()
				history[key] = append(history[key], f)
				mu.Unlock()
				if err := d.Release(ctx, driver.Grant{Key: key, Owner: o, Fence: f}); err != nil {
					t.Errorf("release %s fence %d: %v", key, f, err)
					return
				}
				i++
			}
		}()
	}
	wg.Wait()
	close(stop)
	pruner.Wait()
	for _, k := range keys {
		h := history[k]
		for i := 1; i < len(h); i++ {
			if h[i] <= h[i-1] {
				t.Errorf("%s: fence %d granted after %d (grant %d of %d): a pruned key's fence went back", k, h[i], h[i-1], i, len(h))
				break
			}
		}
	}
	if pruned.Load() == 0 {
		t.Fatalf("no prune deleted anything while %d or more grants ran for up to 10s; the race was not exercised", workers*grantsPerWorker)
	}
	t.Logf("%d grants, %d rows pruned meanwhile, %d tries found the store unavailable",
		workers*grantsPerWorker, pruned.Load(), unavailable.Load())
}

func (s *floorSuite) testBadInput(t *testing.T) {
	ctx := Context(t)
	d := s.open(t, newTable())
	if _, err := d.RaiseFenceFloor(ctx, limits.MaxFenceFloor+1); !errors.Is(err, fenced.ErrInvalidFloor) {
		t.Errorf("RaiseFenceFloor above MaxFenceFloor: %v, want ErrInvalidFloor", err)
	}
	if _, _, err := d.Prune(ctx, -time.Second); !errors.Is(err, fenced.ErrInvalidTTL) {
		t.Errorf("Prune(-1s): %v, want ErrInvalidTTL", err)
	}
	if floor, _, err := d.FenceFloor(ctx); err != nil || floor != 0 {
		t.Errorf("after refused input the floor is %d, %v; want 0", floor, err)
	}
	if got, err := d.RaiseFenceFloor(ctx, limits.MaxFenceFloor); err != nil || got != limits.MaxFenceFloor {
		t.Fatalf("RaiseFenceFloor(MaxFenceFloor) = %d, %v", got, err)
	}
	if f := cycle(t, d, "k:top"); f != limits.MaxFenceFloor+1 {
		t.Errorf("fence above the highest floor = %d, want %d", f, limits.MaxFenceFloor+1)
	}
}
