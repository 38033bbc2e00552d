package app

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
)

const (
	// reloadDebounce gathers the several events one save makes into one
	// reload, and is how long the file must then stay the same before it
	// is read.
	reloadDebounce = 300 * time.Millisecond
	// settleBound is the longest a reload waits for the file to stop
	// changing; a file still changing then is not applied.
	settleBound = 10 * time.Second
)

// ErrCeilingLost refuses a reload whose file leaves out a money key that
// the running config set, or switches off a ceiling it enforces: see
// [LostCeilings].
var ErrCeilingLost = errors.New("app: the new config leaves out a money key the running config set")

// Watch reloads config.toml from path on SIGHUP and whenever the file is
// saved, until ctx ends. A file that cannot be watched is logged, and
// SIGHUP still works.
func (a *App) Watch(ctx context.Context, path string) {
	reload := func(trigger string) {
		data, err := settled(ctx, path, reloadDebounce, settleBound)
		if err != nil {
			if ctx.Err() == nil {
				a.log.Error("config reload refused: the running config is kept", "trigger", trigger, "err", err)
			}
			return
		}
		next, err := loadData(path, data, a.opts.Getenv)
		if err != nil {
			a.log.Error("config reload refused: the running config is kept", "trigger", trigger, "err", err)
			return
		}
		a.Reload(next, trigger) // logs a refusal itself
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				reload("SIGHUP")
			}
		}
	}()
	if err := watchFile(ctx, path, reloadDebounce, func() { reload("file changed") }); err != nil {
		a.log.Warn("config.toml is not watched; reload with SIGHUP", "err", err)
	}
}

// Reload applies next to the running service: the thresholds (rate
// limits, budget ceilings, plans, prices, detectors) are swapped at once
// and no counter is lost. Settings that cannot change live are reported
// as needing a restart and keep running as they are. next must have
// passed Load.
//
// A next that leaves out a money key the running config set (see
// [LostCeilings]) is refused whole, logged, and the running config kept:
// the error wraps ErrCeilingLost. A restart applies such a file.
func (a *App) Reload(next Config, trigger string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := a.cfg
	if lost := LostCeilings(cur, next); len(lost) > 0 {
		err := fmt.Errorf("%w: %s (a key left out takes its default, which may be a higher ceiling; a 0 switches a ceiling off); "+
			"write the keys back, or restart to apply the file as it is", ErrCeilingLost, strings.Join(lost, " "))
		a.log.Error("config reload refused: the running config is kept", "trigger", trigger, "err", err)
		return err
	}
	changed := ChangedKeys(cur, next)
	for _, key := range NeedsRestart(cur, next) {
		a.log.Warn("config change needs a restart to apply", "key", key)
	}
	for _, w := range next.OffSwitches() {
		a.log.Warn("LIMIT OFF: " + w)
	}
	a.layers.Windows.SetConfig(next.Limits.User)
	a.inviteLimits.Windows.SetConfig(next.Invites.Limits())
	a.srv.SetShadow(next.Limits.User.Shadow())
	a.inviteLimits.SetShadow(next.Invites.Shadow())
	a.layers.Brake.SetConfig(next.Budget)
	a.plans.Set(next.Plans)
	a.srv.SetRoutes(next.Routes)                            // limits live; routes added, removed or reshaped need a restart
	if err := a.detect.SetConfig(next.Detect); err != nil { // validated by Load: not expected
		a.log.Error("detect thresholds not reloaded", "err", err)
	}
	// What needs a restart stays as it runs, so it is reported again if
	// changed again.
	next.Server, next.Storage, next.Budget.Timezone, next.Auth = cur.Server, cur.Storage, cur.Budget.Timezone, cur.Auth
	next.Invites = keepFailLimit(next.Invites, cur.Invites)
	next.Routes = keepRouteStructure(next.Routes, cur.Routes)
	next.Detect.RunAt, next.Alerts = cur.Detect.RunAt, cur.Alerts
	// Prices apply live; the output cap, the model and its
	// media_resolution are sent by the OCR client made at start, so the
	// worst case must keep using the cap and image rule it sends. A new
	// model's prices wait for the restart that brings the model.
	price := cur.OCR.Price.WithPricesOf(next.OCR.Price)
	if next.OCR.Model != cur.OCR.Model {
		price = cur.OCR.Price
	}
	next.OCR = cur.OCR
	next.OCR.Price = price
	a.srv.SetPrice(price)
	a.deny.Clear() // a limit may be raised; each instance's reload clears its own
	a.cfg = next
	if len(changed) == 0 {
		a.log.Info("config reloaded: no key changed", "trigger", trigger)
		return nil
	}
	a.log.Info("config reloaded", "trigger", trigger, "changed", strings.Join(changed, " "))
	return nil
}

// settled returns the content of path once it has stopped changing: two
// looks quiet apart that agree on size, modification time and content.
// A save in several writes is so read whole, unless its writes are more
// than quiet apart; LostCeilings guards that case. A file still changing
// after bound is an error.
func settled(ctx context.Context, path string, quiet, bound time.Duration) ([]byte, error) {
	return settle(ctx, path, func() (fileLook, error) { return lookAt(path) }, quiet, bound)
}

// fileLook is what settle compares between two looks at a file.
type fileLook struct {
	size  int64
	mtime time.Time
	sum   [sha256.Size]byte
	data  []byte
}

func lookAt(path string) (fileLook, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileLook{}, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fileLook{}, err
	}
	return fileLook{size: fi.Size(), mtime: fi.ModTime(), sum: sha256.Sum256(data), data: data}, nil
}

// settle is settled with the looks taken by look.
func settle(ctx context.Context, path string, look func() (fileLook, error), quiet, bound time.Duration) ([]byte, error) {
	prev, err := look()
	if err != nil {
		return nil, err
	}
	timer := time.NewTimer(quiet)
	defer timer.Stop()
	for waited := time.Duration(0); ; waited += quiet {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer.C:
		}
		cur, err := look()
		if err != nil {
			return nil, err
		}
		if cur.size == prev.size && cur.mtime.Equal(prev.mtime) && cur.sum == prev.sum {
			return cur.data, nil
		}
		if waited+quiet >= bound {
			return nil, fmt.Errorf("config %s: still changing after %s: not read; save it again, or send SIGHUP", path, bound)
		}
		prev = cur
		timer.Reset(quiet)
	}
}

// bytesProvider hands koanf a file's content already read.
type bytesProvider []byte

func (b bytesProvider) ReadBytes() ([]byte, error) { return b, nil }

func (b bytesProvider) Read() (map[string]any, error) {
	return nil, errors.New("bytesProvider: Read is not supported; use ReadBytes with a parser")
}

// watchFile calls changed, at most once per quiet period, after path is
// written, replaced or re-created. It watches the folder, not the file,
// so editors that save by renaming a new file over the old one, or by
// deleting and re-creating it, are followed.
func watchFile(ctx context.Context, path string, quiet time.Duration, changed func()) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	if err := w.Add(filepath.Dir(abs)); err != nil {
		w.Close()
		return err
	}
	go func() {
		defer w.Close()
		timer := time.NewTimer(quiet)
		timer.Stop()
		for {
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if filepath.Clean(ev.Name) == abs {
					timer.Reset(quiet)
				}
			case <-w.Errors:
			case <-timer.C:
				changed()
			}
		}
	}()
	return nil
}
