// Package engine runs runs: it claims queued runs with a lease, streams the
// pending step from the model into the stream buffer, publishes the finished
// message with its checkpoint, honours cancels at safe points, and recovers
// runs whose worker died.
//
// A run's context belongs to the engine: it derives from the engine's own
// lifetime, never from a request or a connection, so a client that goes
// away cancels nothing. Only an accepted cancel (or shutdown, which hands
// the run back intact) stops a run.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/model"
	"github.com/honestcancel/gateway/tools"
)

// Store is what the engine needs from persistence, by role. Every method
// is one transaction; the ones taking a lease refuse with
// *chat.ErrNotRunning once the run no longer runs under that lease
// (Fenced: the lease is no longer the run's current one), so an execution
// that lost its run stops at its next write and publishes nothing.
type Store interface {
	Commands
	Queue
	Leases
	Execution
	Reconciliation
}

// Commands is what the user's commands need (StartRun, CancelRun,
// DeleteThread, DecideOperation), and the titler.
type Commands interface {
	StartRun(ctx context.Context, p chat.StartRun) (chat.RunStartAck, error)
	// StartRunClaimed is StartRun that may also claim the run for owner in
	// the same commit, when spare slots besides the one the caller holds
	// for it cover every other run waiting (nil claim otherwise).
	StartRunClaimed(ctx context.Context, p chat.StartRun, owner string, ttl time.Duration, spare int) (
		chat.RunStartAck, *chat.Claim, error,
	)
	RequestCancel(ctx context.Context, p chat.CancelRun) (chat.CancelAck, chat.RunStatus, error)
	// DeleteThread deletes a thread none of whose runs goes on
	// (run_already_active otherwise); Run reads a run of the user.
	DeleteThread(ctx context.Context, userID, threadID string, expected *int64) (chat.ThreadDeletedAck, error)
	Run(ctx context.Context, userID, runID string) (chat.Run, error)
	DecideOperation(ctx context.Context, p chat.Decide) (chat.ConfirmAck, error)
	// Retitle gives the thread title to when its title is still from.
	Retitle(ctx context.Context, threadID, from, to string) error
}

// Queue is what the message queue's commands need (store/queue.go). A
// run started from the queue is made queued by the store, in the
// transaction of a run's end or of the command: QueueStarts wakes the
// dispatcher to claim it.
type Queue interface {
	QueueAdd(ctx context.Context, p chat.QueueAdd) (chat.QueueAddAck, *chat.Interruption, error)
	QueueUpdate(ctx context.Context, p chat.QueueUpdate) (chat.QueueItemAck, error)
	QueueRemove(ctx context.Context, p chat.QueueRemove) (chat.QueueItemAck, error)
	QueueResume(ctx context.Context, p chat.QueueResume) (chat.QueueResumeAck, error)
	QueueStarts() <-chan struct{}
}

// Leases is what dispatch, the maintenance loop and recovery need: runs
// claimed, held, taken back and cancelled.
type Leases interface {
	// ClaimBatch (up to max runs in one write), RenewLeases and Recover
	// grant and judge leases by the store's lease clock (the database's,
	// on PostgreSQL).
	ClaimBatch(ctx context.Context, owner string, ttl time.Duration, max int) ([]*chat.Claim, error)
	RenewLeases(ctx context.Context, leases []chat.Lease, ttl time.Duration) error
	Recover(ctx context.Context, owner string, foreignExpired bool, maxAttempts int) ([]chat.Recovered, error)
	// FinishCancel with a nil lease finishes only a run no worker holds.
	FinishCancel(ctx context.Context, runID string, lease *chat.Lease, unbufferedChars int64) (bool, error)
	// CancelsRequested lists the runs owner leases whose cancel was
	// accepted (by any instance) and not yet taken up.
	CancelsRequested(ctx context.Context, owner string) ([]string, error)
	// RunHolder is the lease owner of an active run ("" none), as last
	// committed (it may change right after).
	RunHolder(ctx context.Context, runID string) (string, error)
	// QueueState is a queued run's place in the claim order (0: not
	// waiting to be claimed) and whether its user holds their share of
	// executing runs; QueuedRuns counts the queued runs not yet claimed.
	QueueState(ctx context.Context, runID string) (position int, atShare bool, err error)
	QueuedRuns(ctx context.Context) (int, error)
}

// Execution is what one execution of a run writes under its lease.
type Execution interface {
	RunInput(ctx context.Context, runID string) (chat.RunInput, error)
	AppendDeltas(ctx context.Context, lease chat.Lease, messageID string, texts []string) error
	PublishStep(ctx context.Context, lease chat.Lease, out chat.StepOutput) error
	SetOperationPhase(ctx context.Context, lease chat.Lease, opID, phase, outcome string, needRunning bool) error
	RecordToolResult(ctx context.Context, lease chat.Lease, opID string, out chat.ToolOutcome) error
	RecordToolProgress(ctx context.Context, lease chat.Lease, opID string, p chat.ToolProgress) error
	MarkCancelling(ctx context.Context, lease chat.Lease, active chat.ActiveOperation) error
	Complete(ctx context.Context, lease chat.Lease) error
	// CompleteWith is PublishStep of a run's last step (no tool call) and
	// Complete in one transaction.
	CompleteWith(ctx context.Context, lease chat.Lease, out chat.StepOutput) error
	Fail(ctx context.Context, lease chat.Lease, message string) error
	// RestartStep starts a step whose message lost deltas
	// (chat.ErrDeltasLost) over, attempt + 1, under the same lease, or
	// fails the run "interrupted" at MaxAttempts (again false).
	RestartStep(ctx context.Context, lease chat.Lease, maxAttempts int) (again bool, err error)
	Release(ctx context.Context, lease chat.Lease) error
	AddUsage(ctx context.Context, runID string, u chat.Usage) error
}

// Reconciliation is what settling unknown tool outcomes needs:
// DueReconciliations hands out unknown outcomes whose lookup by key is
// due; SettleReconciliation records what the lookup found.
type Reconciliation interface {
	DueReconciliations(ctx context.Context, limit int) ([]chat.Operation, error)
	SettleReconciliation(ctx context.Context, opID string, found chat.Lookup) (chat.Operation, error)
}

// Retention is what the maintenance loop needs to age out each artifact
// class (store.Retention): each call removes (or redacts) what is older
// than before, in short transactions, and reports how many rows it did.
type Retention interface {
	PurgeStream(ctx context.Context, before time.Time) (int64, error)
	PurgeEvents(ctx context.Context, before time.Time) (int64, error)
	PurgeCancelAudit(ctx context.Context, before time.Time) (int64, error)
	RedactDeletedDrafts(ctx context.Context, before time.Time) (int64, error)
	RedactDeletedThreads(ctx context.Context, before time.Time) (int64, error)
}

// Config configures an Engine. Zero values take the defaults.
type Config struct {
	Store Store
	// Retention ages out the stream buffer and the classes below on the
	// purge tick (nil: nothing is purged, whatever the TTLs say).
	Retention Retention
	Model     model.Backend
	// ModelName is what a published reply says it was asked of
	// (chat.Message.Model): "demo", or the OpenAI model name.
	ModelName string
	// MaxReplyBytes is the size limit of one reply's text, in UTF-8 bytes
	// of the published content (default chat.DefaultReplyBytes): a reply
	// that reaches it is stopped there (the model call is ended as a
	// cancel ends it, closing the upstream connection) and published up
	// to it, marked chat.TruncatedSizeLimit; a card cut there fails its
	// run (a cut JSON document is no card).
	MaxReplyBytes int
	// Titler names a new conversation from its first request (nil: the
	// title stays the start of that request).
	Titler Titler
	// Tools the model may call (nil: none).
	Tools *tools.Registry
	Log   *slog.Logger
	// InstanceID names this process in run leases.
	InstanceID string
	// SingleInstance treats every lease not held by this process as
	// expired (one instance on SQLite: a lease of another owner can only
	// be left by a previous process).
	SingleInstance bool
	Workers        int           // runs executed at once (default 64)
	LeaseTTL       time.Duration // default 15s
	StreamTTL      time.Duration // how long deltas stay buffered (default 10m)
	MaxAttempts    int           // attempts before a run fails "interrupted" (default 3)
	// MaxBatch bounds the deltas written in one stream-buffer transaction
	// (default 64).
	MaxBatch int
	// ClaimBatch bounds the runs one claim asks for (default 16). The
	// store may give fewer per transaction (PostgreSQL: one, see
	// store.ClaimBatch); set it to what the store gives, as dispatch asks
	// again at once only when it got all it asked for.
	ClaimBatch int
	// ClaimPoll is how often dispatch looks for queued runs without a
	// wake-up (default 1s): a wake-up lost or never sent is made up for.
	ClaimPoll time.Duration
	// Retention of the other artifact classes; 0 keeps them forever.
	// EventTTL: durable events in the log (a thread keeps its last event
	// and every event of a run not finished; older replays get a
	// snapshot). AuditTTL: cancel audit rows of finished runs. DraftTTL: the
	// text of deleted drafts and deleted threads (the rows stay, emptied).
	EventTTL time.Duration
	AuditTTL time.Duration
	DraftTTL time.Duration
	// PurgeEvery is how often the stream buffer and the classes above are
	// purged (default StreamTTL/4, at most a minute).
	PurgeEvery time.Duration
	// Metrics records runs executing, time to first token and tokens used
	// (nil: nothing is recorded).
	Metrics Metrics
	// Wakeups tells the other instances that a cancel was accepted here
	// for a run this engine does not execute (the bus; nil with one
	// instance). The instance that executes it calls WakeCancels.
	Wakeups CancelWakeups
	// Holders hands a cancel of a run another process executes to that
	// process (the bus; nil with one instance): it accepts the cancel in
	// its own transaction, after the deltas it streamed and has not
	// written yet, and stops its worker at once. When it does not confirm
	// receipt at once (the bus bounds that: gone, stopped, cut off) or
	// does not answer within forwardTimeout, the cancel is accepted here.
	Holders CancelForwarder
	// CancelPoll is how often an engine of several instances looks for
	// cancels accepted elsewhere whose wake-up it never got (default 1s;
	// unused with SingleInstance).
	CancelPoll time.Duration
	// ReconcilePoll is how often the reconciler asks the store for
	// unknown outcomes whose lookup by key is due (default 1s).
	ReconcilePoll time.Duration
	// SettleTimeout bounds how long a worker keeps trying the write that
	// settles its run (finish the cancel, record the failure, hand it
	// back) while the database fails it (default 10s); then the run's
	// lease expires and recovery settles it.
	SettleTimeout time.Duration
}

// CancelForwarder hands a cancel to the process holder that executes the
// run. A *chat.Error is that process's refusal of the cancel; any other
// error means it did not answer.
type CancelForwarder interface {
	ForwardCancel(ctx context.Context, holder string, p chat.CancelRun) (chat.CancelAck, error)
}

// forwardTimeout bounds the wait for the process executing a run to
// accept a cancel it confirmed it received. It is long enough for a busy
// holder's writer queue: accepting the cancel here as well would add the
// same work to both instances' writers (see bus/holders.go).
const forwardTimeout = 2 * time.Second

// CancelWakeups carries cancel wake-ups to other instances. PublishCancel
// must not block; a lost wake-up costs at most Config.CancelPoll.
type CancelWakeups interface {
	PublishCancel(runID string)
}

// Engine executes runs. Create it with New, call Start once, and Close once
// to stop: Close cancels every goroutine it started and waits for them.
type Engine struct {
	cfg     Config
	store   Store
	model   model.Backend
	tools   *tools.Registry
	log     *slog.Logger
	metrics Metrics

	ctx        context.Context
	cancel     context.CancelCauseFunc
	wg         sync.WaitGroup
	wake       chan struct{}
	cancelWake chan struct{} // WakeCancels -> watchCancels

	// slots holds one token per execution running here (capacity
	// Config.Workers), and one per slot reserved for a claim in flight:
	// dispatch and StartRun add tokens without blocking (a slot is
	// reserved before the claim that uses it), and give back those their
	// claim did not use; each execution takes its own back when it ends.
	slots chan struct{}
	// reserving counts the tokens in slots reserved for claims that have
	// not committed yet: free slots for QueuePosition and Admission.
	reserving atomic.Int64
	// waiting is the queued runs not yet claimed, as dispatch last
	// counted them (Admission).
	waiting atomic.Int64

	mu      sync.Mutex
	running map[string]*liveRun // run id -> the execution holding it here
}

var (
	errCancelRequested = errors.New("cancel requested")
	errShutdown        = errors.New("engine shutting down")
)

// New returns an engine that is not started yet.
func New(cfg Config) *Engine {
	if cfg.Workers <= 0 {
		cfg.Workers = 64
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 15 * time.Second
	}
	if cfg.StreamTTL <= 0 {
		cfg.StreamTTL = 10 * time.Minute
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 3
	}
	if cfg.ClaimBatch <= 0 {
		cfg.ClaimBatch = defaultClaimBatch
	}
	if cfg.ClaimPoll <= 0 {
		cfg.ClaimPoll = time.Second
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 64
	}
	if cfg.MaxReplyBytes <= 0 {
		cfg.MaxReplyBytes = chat.DefaultReplyBytes
	}
	if cfg.PurgeEvery <= 0 {
		cfg.PurgeEvery = min(cfg.StreamTTL/4, time.Minute)
	}
	if cfg.CancelPoll <= 0 {
		cfg.CancelPoll = time.Second
	}
	if cfg.ReconcilePoll <= 0 {
		cfg.ReconcilePoll = time.Second
	}
	if cfg.SettleTimeout <= 0 {
		cfg.SettleTimeout = storeTimeout
	}
	if cfg.InstanceID == "" {
		cfg.InstanceID = chat.NewID("ins_")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = noMetrics{}
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Engine{
		cfg: cfg, store: cfg.Store, model: cfg.Model, tools: cfg.Tools, log: cfg.Log, metrics: cfg.Metrics,
		ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1), cancelWake: make(chan struct{}, 1),
		running: map[string]*liveRun{}, slots: make(chan struct{}, cfg.Workers),
	}
}

// Start recovers the runs a dead process left behind, then starts the
// dispatcher and the maintenance loop.
func (e *Engine) Start(ctx context.Context) error {
	if err := e.recover(ctx); err != nil {
		return err
	}
	e.wg.Go(e.dispatch)
	e.wg.Go(e.maintain)
	e.wg.Go(e.reconcile)
	if !e.cfg.SingleInstance {
		e.wg.Go(e.watchCancels)
	}
	return nil
}

// Close stops claiming, hands every run in flight back to the queue at its
// next safe point (nothing is cancelled, nothing half-streamed is
// published), and waits for every goroutine of the engine.
func (e *Engine) Close() {
	e.mu.Lock() // no CancelRun starts a goroutine after this (see there)
	e.cancel(errShutdown)
	e.mu.Unlock()
	e.wg.Wait()
}

// StartRun performs run.start and wakes a worker.
func (e *Engine) StartRun(ctx context.Context, p chat.StartRun) (chat.RunStartAck, error) {
	if err := p.Validate(); err != nil {
		return chat.RunStartAck{}, err
	}
	// With a slot free the start also claims its run when no other run
	// waits for one (store.StartRunClaimed): the run starts executing with
	// the start's commit, without a claim of its own.
	var ack chat.RunStartAck
	var claim *chat.Claim
	var err error
	if e.reserve(1) == 1 {
		// The spare slots are the others free or reserved: those claims
		// are for the runs already waiting.
		ack, claim, err = e.store.StartRunClaimed(ctx, p, e.cfg.InstanceID, e.cfg.LeaseTTL, e.freeSlots()-1)
		if claim != nil {
			e.launch(claim, time.Now())
		} else {
			e.unreserve(1)
		}
	} else {
		ack, err = e.store.StartRun(ctx, p)
	}
	if err != nil {
		return ack, err
	}
	if claim != nil {
		return ack, nil
	}
	e.poke()
	if ack.Status == chat.RunQueued {
		// The run exists whatever this read says: a failed read leaves the
		// position out, it does not fail the start.
		if pos, err := e.QueuePosition(ctx, ack.RunID); err == nil {
			ack.QueuePosition = pos
		} else {
			e.log.Warn("read the new run's place in the queue", "run_id", ack.RunID, "err", err)
		}
	}
	return ack, nil
}

// liveRun is one execution of a run by this engine; its identity tells a
// new execution of the same run from an old one still unwinding. Only a
// registered execution's lease is renewed.
type liveRun struct {
	cancel context.CancelCauseFunc
	lease  chat.Lease
}

// CancelRun performs run.cancel: the store records cancel_requested and
// answers at once; then the worker running it is woken (its model call's
// context is cancelled), or, when no worker holds the run, the cancel is
// finished here.
func (e *Engine) CancelRun(ctx context.Context, p chat.CancelRun) (chat.CancelAck, error) {
	if err := p.Validate(); err != nil {
		return chat.CancelAck{}, err
	}
	if e.cfg.Holders != nil && !e.cfg.SingleInstance {
		holder, err := e.store.RunHolder(ctx, p.RunID)
		if err == nil && holder != "" && holder != e.cfg.InstanceID {
			fwd, cancel := context.WithTimeout(ctx, forwardTimeout)
			ack, err := e.cfg.Holders.ForwardCancel(fwd, holder, p)
			cancel()
			var ce *chat.Error
			if err == nil || errors.As(err, &ce) {
				return ack, err
			}
			if ctx.Err() != nil {
				return chat.CancelAck{}, ctx.Err()
			}
			e.log.Warn("the instance executing the run did not take its cancel: accepting it here", "run_id", p.RunID, "holder", holder, "err", err)
			p.Resent = true // it may have, and just not answered in time
		}
	}
	return e.cancelHere(ctx, p)
}

// CancelRunHere is CancelRun without handing the cancel to another
// process: what an instance does with a cancel another one forwards to it
// (Config.Holders). It checks the command again: it comes over the wire.
func (e *Engine) CancelRunHere(ctx context.Context, p chat.CancelRun) (chat.CancelAck, error) {
	if err := p.Validate(); err != nil {
		return chat.CancelAck{}, err
	}
	return e.cancelHere(ctx, p)
}

// cancelHere records a checked cancel and stops the run's execution here
// (or finishes the cancel when no worker holds the run).
func (e *Engine) cancelHere(ctx context.Context, p chat.CancelRun) (chat.CancelAck, error) {
	ack, prev, err := e.store.RequestCancel(ctx, p)
	if err != nil || ack.AlreadyRequested {
		return ack, err
	}
	e.carryCancel(p.RunID, prev)
	return ack, nil
}

// carryCancel takes a cancel the store recorded to the run's execution:
// the worker here running it is woken (its model call's context is
// cancelled); otherwise the instance that may execute it is woken, and
// the cancel of a run no worker holds is finished here.
func (e *Engine) carryCancel(runID string, prev chat.RunStatus) {
	// Cancel under e.mu: an execution that unregisters has either been
	// cancelled already or is not found here (see execute). Also under
	// e.mu: no finishing goroutine is started once Close began (the cancel
	// is recorded; recovery at the next start finishes it).
	e.mu.Lock()
	defer e.mu.Unlock()
	if live := e.running[runID]; live != nil {
		live.cancel(errCancelRequested)
		return
	}
	if e.ctx.Err() != nil {
		return
	}
	if e.cfg.Wakeups != nil {
		// Another instance may execute it: wake that one now rather than
		// at its next poll or its next delta write.
		e.cfg.Wakeups.PublishCancel(runID)
	}
	// No worker here holds it (queued, waiting for a confirmation, or handed
	// over between steps): finish it now, unless a worker took it in the
	// meantime, which then sees the recorded cancel in its first read of
	// the run. Finishing is the engine's work, not the request's.
	e.wg.Go(func() {
		settle, stop := context.WithTimeout(context.WithoutCancel(e.ctx), storeTimeout)
		defer stop()
		if _, err := e.store.FinishCancel(settle, runID, nil, 0); err != nil {
			e.log.Warn("finish cancel", "run_id", runID, "prev", prev, "err", err)
		}
	})
}

// deleteWait bounds how long thread.delete waits for the run it cancelled
// to end before it answers run_already_active (a cancel waits for a call
// already handed to an external system to be confirmed).
const deleteWait = 10 * time.Second

// DeleteThread performs thread.delete: a run of the thread that has not
// ended is cancelled first, in the deleter's name (reason
// chat.ReasonThreadDeleted, its receipt as usual: run.cancelled reaches
// the tabs before thread.deleted), and once it ended the thread is deleted.
// The expected version, when given, is checked before anything is done;
// the cancel's own events then move the version on, so the deletion that
// follows it does not check it again.
func (e *Engine) DeleteThread(ctx context.Context, p chat.DeleteThread) (chat.ThreadDeletedAck, error) {
	if err := p.Validate(); err != nil {
		return chat.ThreadDeletedAck{}, err
	}
	expected := p.ExpectedStateVersion
	deadline := time.Now().Add(deleteWait)
	for {
		ack, err := e.store.DeleteThread(ctx, p.UserID, p.ThreadID, expected)
		var ce *chat.Error
		if !errors.As(err, &ce) || ce.Code != chat.CodeRunAlreadyActive {
			return ack, err
		}
		runID, _ := ce.Fields["run_id"].(string)
		if runID == "" || time.Now().After(deadline) {
			return ack, chat.Errorf(chat.CodeRunAlreadyActive,
				"run %s was cancelled but has not stopped yet (a tool call it handed to an external system is still being confirmed): delete the conversation again in a moment", runID).
				With("run_id", runID)
		}
		expected = nil
		_, err = e.CancelRun(ctx, chat.CancelRun{UserID: p.UserID, RunID: runID, Reason: chat.ReasonThreadDeleted, RequestedBy: p.RequestedBy})
		if err != nil && chat.ErrorCode(err) != chat.CodeRunNotActive {
			return chat.ThreadDeletedAck{}, err
		}
		if err := e.waitEnded(ctx, p.UserID, runID, deadline); err != nil {
			return chat.ThreadDeletedAck{}, err
		}
	}
}

// waitEnded waits, until deadline, for the run to reach a terminal status
// (read from the store, which is the truth whichever instance ends it).
func (e *Engine) waitEnded(ctx context.Context, userID, runID string, deadline time.Time) error {
	pause := 10 * time.Millisecond
	for {
		r, err := e.store.Run(ctx, userID, runID)
		if err != nil || r.Status.Terminal() || time.Now().After(deadline) {
			return err
		}
		t := time.NewTimer(min(pause, time.Until(deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-e.ctx.Done():
			t.Stop()
			return errShutdown
		case <-t.C:
		}
		pause = min(2*pause, 200*time.Millisecond)
	}
}

// DecideOperation performs tool.confirm or tool.reject and wakes a worker
// to commit the call (or to continue from the refusal).
func (e *Engine) DecideOperation(ctx context.Context, p chat.Decide) (chat.ConfirmAck, error) {
	ack, err := e.store.DecideOperation(ctx, p)
	if err == nil {
		e.poke()
	}
	return ack, err
}

// WakeCancels tells the engine that a cancel was accepted on another
// instance (the bus's cancel wake-up). It never blocks; the engine then
// looks up which of its runs have a cancel accepted and stops them.
func (e *Engine) WakeCancels() {
	select {
	case e.cancelWake <- struct{}{}:
	default:
	}
}

// watchCancels stops the runs executing here whose cancel another instance
// accepted: at once on a wake-up, and every CancelPoll in case a wake-up
// was lost (the bus is best effort; the store is the truth). Only the
// store's word cancels a run: a wake-up itself carries no authority.
func (e *Engine) watchCancels() {
	e.onTicks(e.cfg.CancelPoll, e.cancelWake, func() {
		e.mu.Lock()
		idle := len(e.running) == 0
		e.mu.Unlock()
		if idle {
			return
		}
		look, stop := context.WithTimeout(e.ctx, storeTimeout)
		ids, err := e.store.CancelsRequested(look, e.cfg.InstanceID)
		stop()
		if err != nil {
			if e.ctx.Err() == nil {
				e.log.Warn("look up cancels accepted elsewhere", "err", err)
			}
			return
		}
		e.mu.Lock()
		for _, id := range ids {
			if live := e.running[id]; live != nil {
				live.cancel(errCancelRequested)
			}
		}
		e.mu.Unlock()
	})
}

// onTicks calls pass every period and at every wake-up (a nil wake: none),
// one pass at a time, until the engine closes.
func (e *Engine) onTicks(period time.Duration, wake <-chan struct{}, pass func()) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-wake:
		case <-tick.C:
		}
		pass()
	}
}

func (e *Engine) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// maintain renews the leases of the executions running here, applies
// retention (stream buffer, event log, cancel audit, deleted drafts) and
// settles runs whose lease expired: another instance's, and this
// process's own whose execution is gone (a final write that failed, a
// worker that died), so an accepted cancel never waits for a restart.
func (e *Engine) maintain() {
	renew := time.NewTicker(e.cfg.LeaseTTL / 3)
	defer renew.Stop()
	purge := time.NewTicker(e.cfg.PurgeEvery)
	defer purge.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-renew.C:
			if err := e.store.RenewLeases(e.ctx, e.liveLeases(), e.cfg.LeaseTTL); err != nil && e.ctx.Err() == nil {
				e.log.Error("renew leases", "err", err)
			}
			if err := e.recover(e.ctx); err != nil && e.ctx.Err() == nil {
				e.log.Error("recover runs", "err", err)
			}
		case <-purge.C:
			e.purge(time.Now())
		}
	}
}

// purge removes what each artifact class keeps no longer. Each store call
// works in short, bounded transactions; what is left goes at the next tick.
// Only counts are logged, never content.
func (e *Engine) purge(now time.Time) {
	r := e.cfg.Retention
	if r == nil {
		return
	}
	classes := []struct {
		ttl  time.Duration
		fn   func(context.Context, time.Time) (int64, error)
		what string // for the log
		unit string
	}{
		{e.cfg.StreamTTL, r.PurgeStream, "stream buffer", "deltas"},
		{e.cfg.EventTTL, r.PurgeEvents, "event log", "events"},
		{e.cfg.AuditTTL, r.PurgeCancelAudit, "cancel audit", "rows"},
		{e.cfg.DraftTTL, r.RedactDeletedDrafts, "deleted drafts", "redacted"},
		{e.cfg.DraftTTL, r.RedactDeletedThreads, "deleted conversations", "redacted"},
	}
	for _, c := range classes {
		if c.ttl <= 0 || e.ctx.Err() != nil {
			continue
		}
		n, err := c.fn(e.ctx, now.Add(-c.ttl))
		if err != nil && e.ctx.Err() == nil {
			e.log.Error("purge "+c.what, "err", err)
		}
		if n > 0 {
			e.log.Debug("purged "+c.what, c.unit, n)
		}
	}
}

// liveLeases are the leases of the executions registered here.
func (e *Engine) liveLeases() []chat.Lease {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]chat.Lease, 0, len(e.running))
	for _, live := range e.running {
		out = append(out, live.lease)
	}
	return out
}

func (e *Engine) recover(ctx context.Context) error {
	done, err := e.store.Recover(ctx, e.cfg.InstanceID, e.cfg.SingleInstance, e.cfg.MaxAttempts)
	for _, r := range done {
		e.log.Info("recovered run", "run_id", r.RunID, "action", r.Action)
	}
	if err != nil {
		return fmt.Errorf("recover runs: %w", err)
	}
	if len(done) > 0 {
		e.poke()
	}
	return nil
}
