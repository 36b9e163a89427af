package drivertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/capability"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
)

// testCapabilities checks that the driver's declaration (Capabilities) and
// its methods agree. Every declared operation has its methods;
// the lookup behind Client.Capabilities drops a flag without them. A method
// present but not declared is not there at all. The subscriptions, the
// queue, terms, batches and checkpoints are the exception: their availability may depend
// on how the driver was opened, so such a method refuses with
// fenced.ErrUnsupported instead. The other declared operations are exercised by the tests named after them.
func (s *suite) testCapabilities(t *testing.T) {
	d := s.drv(t)
	declared := d.Capabilities()
	has := capability.Implemented(d)
	flags := []struct {
		name              string
		declared, has     bool
		refusesUndeclared func() error
	}{
		{"Subscribe (driver.Notifier)", declared.Subscribe, has.Subscribe, func() error {
			sub, err := d.(driver.Notifier).Subscribe(context.Background(), Key("caps"))
			if err == nil {
				sub.Close()
			}
			return err
		}},
		{"Observe (driver.ObserveNotifier)", declared.Observe, has.Observe, func() error {
			sub, err := d.(driver.ObserveNotifier).SubscribeObserver(context.Background(), Key("caps"))
			if err == nil {
				sub.Close()
			}
			return err
		}},
		{"Queue (driver.TimedQueuer)", declared.Queue, has.Queue, func() error {
			_, _, err := d.(driver.TimedQueuer).AcquireTimed(context.Background(), Key("caps"), owner(), time.Second)
			return err
		}},
		{"Terms (driver.TermsAcquirer)", declared.Terms, has.Terms, func() error {
			_, err := d.(driver.TermsAcquirer).TryAcquireTerms(context.Background(), Key("caps"), owner(),
				time.Second, ttlrule.DefaultSafetyMargin(time.Second))
			return err
		}},
		{"BatchRenew (driver.BatchRenewer)", declared.BatchRenew, has.BatchRenew, func() error {
			_, err := d.(driver.BatchRenewer).RenewBatch(context.Background(),
				[]driver.Grant{{Key: Key("caps"), Owner: owner(), Fence: 1, TTL: time.Second}})
			return err
		}},
		{"WatchLoss (driver.LossWatcher)", declared.WatchLoss, has.WatchLoss, nil},
		{"BreakLog (driver.BreakLogger)", declared.BreakLog, has.BreakLog, nil},
		{"Value (driver.Valuer)", declared.Value, has.Value, nil},
		{"FenceFloor (driver.FenceFloorer)", declared.FenceFloor, has.FenceFloor, nil},
		{"Checkpoint (driver.Checkpointer)", declared.Checkpoint, has.Checkpoint, func() error {
			_, _, err := d.(driver.Checkpointer).ReadCheckpoint(context.Background(), Key("caps"))
			return err
		}},
	}
	for _, f := range flags {
		switch {
		case f.declared && !f.has:
			t.Errorf("%T declares %s but lacks its methods", d, f.name)
		case !f.declared && f.has && f.refusesUndeclared == nil:
			t.Errorf("%T has the methods of %s but does not declare it: declare it, or drop the methods", d, f.name)
		case !f.declared && f.has:
			if err := f.refusesUndeclared(); !errors.Is(err, fenced.ErrUnsupported) {
				t.Errorf("%T has the methods of %s but does not declare it, and they answer %v, want an error matching ErrUnsupported",
					d, f.name, err)
			}
		}
	}
	if declared.FIFO && !declared.Queue {
		t.Errorf("%T declares FIFO without a Queue: only a queue of the authority's serves waiters in order", d)
	}
	if lo, hi := declared.Keeps.MinTTL, declared.Keeps.MaxTTL; lo < 0 || hi < 0 || (hi > 0 && hi < lo) {
		t.Errorf("%T declares TTL bounds [%v, %v]", d, lo, hi)
	}
}
