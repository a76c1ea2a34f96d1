package email

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/honestcancel/gateway/tools"
)

// Outbox faults, for OutboxConfig.Fault.
const (
	// FaultNone: every call behaves.
	FaultNone = ""
	// FaultReject: the provider refuses a new key; nothing is accepted and
	// Send returns tools.ErrRejected.
	FaultReject = "reject"
	// FaultAcceptThenTimeout: the provider accepts and records the key,
	// then the answer is lost: Send returns an error wrapping
	// context.DeadlineExceeded.
	FaultAcceptThenTimeout = "accept-then-timeout"
	// FaultCrash: the provider accepts and records the key, then
	// CrashFunc runs, as if the gateway died before hearing the answer.
	FaultCrash = "crash"
	// FaultRecordLate: the provider takes a new key and will act on it,
	// but the answer is lost (Send returns an error wrapping
	// context.DeadlineExceeded) and it records the key only RecordDelay
	// later, as a service that records a key once it finished acting
	// does: until then Lookup does not find the key and every call with
	// it is answered the same way (it is still being processed); from
	// then on both answer as for any accepted key. So a caller's own
	// lookups right after the lost answer find nothing, and the outcome
	// stays unknown until a later lookup.
	FaultRecordLate = "record-late"
)

// DefaultRecordDelay is OutboxConfig.RecordDelay's default.
const DefaultRecordDelay = 10 * time.Second

// ErrSimulatedCrash is what Send returns under FaultCrash when CrashFunc
// returns (a test's CrashFunc that only records).
var ErrSimulatedCrash = errors.New("outbox: simulated crash after the provider accepted")

// OutboxConfig configures the simulated email provider.
type OutboxConfig struct {
	// Latency is waited (honouring ctx) before the provider sees a call.
	Latency time.Duration
	// Fault is one of FaultNone, FaultReject, FaultAcceptThenTimeout,
	// FaultCrash, FaultRecordLate.
	Fault string
	// RecordDelay is, under FaultRecordLate, how long after taking a new
	// key the provider records it; 0 means DefaultRecordDelay.
	RecordDelay time.Duration
	// FaultEvery applies Fault to calls 1, 1+N, 1+2N, … of this Outbox
	// (counting every Send), so with N = 2 the first call fails and the
	// second succeeds. 0 or 1: every call.
	FaultEvery int
	// CrashFunc is called under FaultCrash, after the acceptance is
	// durable: the program's way of dying there (the gateway's main exits
	// the process); when it returns, or when it is nil, Send returns
	// ErrSimulatedCrash, an error the caller sees as a lost answer.
	CrashFunc func()
}

// Email is a message handed to the provider.
type Email struct {
	To      string
	Subject string
	Body    string
}

// Attempt is one Send call as the provider recorded it.
type Attempt struct {
	ID     int64  `db:"id"`
	Key    string `db:"idempotency_key"`
	At     int64  `db:"at"` // Unix milliseconds
	Result string `db:"result"`
}

// Attempt results.
const (
	AttemptAccepted  = "accepted"  // a new key was accepted
	AttemptDuplicate = "duplicate" // the key was already accepted; its provider_id was returned
	AttemptRejected  = "rejected"  // refused (FaultReject); nothing accepted
	AttemptCancelled = "cancelled" // the caller gave up before the provider saw the call
	AttemptPending   = "pending"   // the key was taken before but is not recorded yet (FaultRecordLate); the answer was lost
)

// DB is the database the provider keeps its tables in (outbox,
// outbox_attempts; the store's migrations create them): the gateway's, as
// store.ServiceDB hands it out. Write runs fn in one write transaction,
// again from scratch if the database made it fail; Read runs fn in one
// consistent read transaction.
type DB interface {
	Write(ctx context.Context, fn func(tx *sqlx.Tx) error) error
	Read(ctx context.Context, fn func(tx *sqlx.Tx) error) error
}

// Outbox plays an external email provider that honours idempotency keys:
// it keeps its own tables (outbox, outbox_attempts) in the database it is
// given (the gateway's: a SQLite file, or PostgreSQL shared by several
// instances, which then share one provider), accepts each key at most
// once, and records every call in outbox_attempts. It opens no connection
// of its own. It is safe for concurrent use.
//
// Once a call has reached the provider (after Latency), it is processed
// to the end even if the caller's ctx ends meanwhile, as a remote system
// would. A key it already accepted is always answered with its
// provider_id (it never claims to reject what it did); the lost-answer and
// crash faults still apply to such repeats. A key taken under
// FaultRecordLate is in its table from the start (so it is never taken
// twice, and a restart does not forget it), with accepted_at the time it
// becomes recorded: before it, Lookup does not see the key.
type Outbox struct {
	db    DB
	cfg   OutboxConfig
	calls atomic.Int64
}

// NewOutbox returns the provider on db, or an error saying which setting
// of cfg is wrong.
func NewOutbox(db DB, cfg OutboxConfig) (*Outbox, error) {
	switch cfg.Fault {
	case FaultNone, FaultReject, FaultAcceptThenTimeout, FaultCrash, FaultRecordLate:
	default:
		return nil, fmt.Errorf("outbox: unknown fault %q: use reject, accept-then-timeout, record-late or crash", cfg.Fault)
	}
	if cfg.FaultEvery < 0 {
		return nil, fmt.Errorf("outbox: negative FaultEvery %d", cfg.FaultEvery)
	}
	if cfg.RecordDelay < 0 {
		return nil, fmt.Errorf("outbox: negative RecordDelay %v", cfg.RecordDelay)
	}
	if cfg.RecordDelay == 0 {
		cfg.RecordDelay = DefaultRecordDelay
	}
	if db == nil {
		return nil, errors.New("outbox: no database")
	}
	return &Outbox{db: db, cfg: cfg}, nil
}

func (o *Outbox) faulty(call int64) bool {
	if o.cfg.Fault == FaultNone {
		return false
	}
	n := int64(o.cfg.FaultEvery)
	return n <= 1 || (call-1)%n == 0
}

func newProviderID() string {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return "prov_" + hex.EncodeToString(b[:])
}

// Send hands msg to the provider under key and returns its provider_id.
// The first Send of a key accepts it; later ones return the same
// provider_id and accept nothing more. Errors: ctx's error if ctx ended
// during Latency (nothing reached the provider), tools.ErrRejected under
// FaultReject (nothing accepted), or, with the key accepted, an error
// wrapping context.DeadlineExceeded (FaultAcceptThenTimeout, and
// FaultRecordLate until the key is recorded) or ErrSimulatedCrash
// (FaultCrash, if CrashFunc returns).
func (o *Outbox) Send(ctx context.Context, key string, msg Email) (string, error) {
	sent, err := o.Deliver(ctx, key, msg)
	return sent.ProviderID, err
}

// Sent is the provider's answer to a call it processed.
type Sent struct {
	ProviderID string
	// Duplicate: the key had been accepted before; nothing was sent now,
	// and ProviderID is the first acceptance's.
	Duplicate bool
	// pending: the key is taken but not recorded yet (FaultRecordLate):
	// the caller gets no answer.
	pending bool
}

// Deliver is Send, answering whether the key had been accepted before.
func (o *Outbox) Deliver(ctx context.Context, key string, msg Email) (Sent, error) {
	if key == "" {
		return Sent{}, errors.New("outbox: empty idempotency key")
	}
	call := o.calls.Add(1)
	fault := ""
	if o.faulty(call) {
		fault = o.cfg.Fault
	}
	if err := tools.Wait(ctx, o.cfg.Latency); err != nil {
		// The request never reached the provider; record the call anyway.
		_ = o.recordAttempt(context.WithoutCancel(ctx), key, AttemptCancelled)
		return Sent{}, err
	}
	// From here on the provider is processing the call: it finishes even
	// if the caller stops waiting.
	pctx := context.WithoutCancel(ctx)

	if fault == FaultReject {
		id, recorded, found, err := o.find(pctx, key)
		if err != nil {
			return Sent{}, err
		}
		switch {
		case !found:
			if err := o.recordAttempt(pctx, key, AttemptRejected); err != nil {
				return Sent{}, err
			}
			return Sent{}, fmt.Errorf("outbox: key %s: %w", key, tools.ErrRejected)
		case !recorded:
			// Taken before (FaultRecordLate) and still being processed:
			// never refused, and no answer yet.
			if err := o.recordAttempt(pctx, key, AttemptPending); err != nil {
				return Sent{}, err
			}
			return Sent{}, lostAnswer(key)
		}
		if err := o.recordAttempt(pctx, key, AttemptDuplicate); err != nil {
			return Sent{}, err
		}
		return Sent{ProviderID: id, Duplicate: true}, nil
	}

	var recordIn time.Duration
	if fault == FaultRecordLate {
		recordIn = o.cfg.RecordDelay
	}
	sent, err := o.accept(pctx, key, msg, recordIn)
	if err != nil {
		return Sent{}, err
	}
	if sent.pending {
		return Sent{}, lostAnswer(key)
	}
	switch fault {
	case FaultAcceptThenTimeout:
		return Sent{}, lostAnswer(key)
	case FaultCrash:
		if o.cfg.CrashFunc != nil {
			o.cfg.CrashFunc()
		}
		return Sent{}, ErrSimulatedCrash
	}
	return sent, nil
}

// lostAnswer is what the caller gets when the provider's answer is lost
// (FaultAcceptThenTimeout; FaultRecordLate while the key is not recorded):
// a timeout, as a caller would see it.
func lostAnswer(key string) error {
	return fmt.Errorf("outbox: no answer from the email provider for key %s: %w", key, context.DeadlineExceeded)
}

// accept takes key once, to be recorded recordIn from now (0 but for
// FaultRecordLate), and records the attempt, in one transaction. A key
// taken before but not recorded yet is answered pending.
func (o *Outbox) accept(ctx context.Context, key string, msg Email, recordIn time.Duration) (Sent, error) {
	var sent Sent
	err := o.db.Write(ctx, func(tx *sqlx.Tx) error {
		clock := time.Now()
		now := clock.UnixMilli()
		at := now
		if recordIn > 0 {
			// Recorded no earlier than recordIn after now: rounded up to the
			// millisecond, not down (rounded down, a key showed up to 1 ms early).
			at = (clock.Add(recordIn).UnixNano() + int64(time.Millisecond) - 1) / int64(time.Millisecond)
		}
		r, err := tx.ExecContext(ctx, tx.Rebind(`INSERT INTO outbox (idempotency_key, recipient, subject, body, provider_id, accepted_at)
			VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (idempotency_key) DO NOTHING`),
			key, msg.To, msg.Subject, msg.Body, newProviderID(), at)
		if err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		n, err := r.RowsAffected()
		if err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		var row struct {
			ID         string `db:"provider_id"`
			AcceptedAt int64  `db:"accepted_at"`
		}
		if err := tx.GetContext(ctx, &row, tx.Rebind(`SELECT provider_id, accepted_at FROM outbox WHERE idempotency_key = ?`), key); err != nil {
			return fmt.Errorf("read back: %w", err)
		}
		result := AttemptAccepted // taken now (and under FaultRecordLate recorded later)
		// Pending is judged by the clock after the INSERT: a caller that read
		// now, then waited for the row another caller was taking, would see
		// that caller's accepted_at (its own now) a millisecond ahead and take
		// a key recorded at once for one recorded later.
		pending := row.AcceptedAt > time.Now().UnixMilli()
		switch {
		case n == 1:
		case pending:
			result = AttemptPending
		default:
			result = AttemptDuplicate
		}
		if _, err := tx.ExecContext(ctx, tx.Rebind(`INSERT INTO outbox_attempts (idempotency_key, at, result) VALUES (?, ?, ?)`),
			key, now, result); err != nil {
			return fmt.Errorf("record the attempt: %w", err)
		}
		sent = Sent{ProviderID: row.ID, Duplicate: result == AttemptDuplicate, pending: pending}
		return nil
	})
	if err != nil {
		return Sent{}, fmt.Errorf("outbox: accept %s: %w", key, err)
	}
	return sent, nil
}

func (o *Outbox) recordAttempt(ctx context.Context, key, result string) error {
	err := o.db.Write(ctx, func(tx *sqlx.Tx) error {
		_, err := tx.ExecContext(ctx, tx.Rebind(`INSERT INTO outbox_attempts (idempotency_key, at, result) VALUES (?, ?, ?)`),
			key, time.Now().UnixMilli(), result)
		return err
	})
	if err != nil {
		return fmt.Errorf("outbox: record attempt for %s: %w", key, err)
	}
	return nil
}

// Lookup returns the provider_id of key, if the provider accepted and
// recorded it (under FaultRecordLate a key is found only RecordDelay after
// it was taken).
func (o *Outbox) Lookup(ctx context.Context, key string) (providerID string, found bool, err error) {
	id, recorded, _, err := o.find(ctx, key)
	if err != nil || !recorded {
		return "", false, err
	}
	return id, true, nil
}

// find reads key's row: whether the provider took it (found) and whether it
// is recorded yet (accepted_at has come).
func (o *Outbox) find(ctx context.Context, key string) (providerID string, recorded, found bool, err error) {
	var row struct {
		ID         string `db:"provider_id"`
		AcceptedAt int64  `db:"accepted_at"`
	}
	err = o.db.Read(ctx, func(tx *sqlx.Tx) error {
		return tx.GetContext(ctx, &row, tx.Rebind(`SELECT provider_id, accepted_at FROM outbox WHERE idempotency_key = ?`), key)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, false, nil
	}
	if err != nil {
		return "", false, false, fmt.Errorf("outbox: look up %s: %w", key, err)
	}
	return row.ID, row.AcceptedAt <= time.Now().UnixMilli(), true, nil
}

// Accepted reports the keys the provider holds as accepted (one row per
// key by its primary key: how often a key was accepted is in Attempts),
// also those taken under FaultRecordLate and not recorded yet: the
// provider acts on them.
func (o *Outbox) Accepted(ctx context.Context) (map[string]bool, error) {
	var keys []string
	if err := o.db.Read(ctx, func(tx *sqlx.Tx) error {
		return tx.SelectContext(ctx, &keys, `SELECT idempotency_key FROM outbox`)
	}); err != nil {
		return nil, fmt.Errorf("outbox: list accepted: %w", err)
	}
	out := make(map[string]bool, len(keys))
	for _, k := range keys {
		out[k] = true
	}
	return out, nil
}

// Attempts lists every Send call the provider recorded, oldest first.
func (o *Outbox) Attempts(ctx context.Context) ([]Attempt, error) {
	var out []Attempt
	if err := o.db.Read(ctx, func(tx *sqlx.Tx) error {
		return tx.SelectContext(ctx, &out, `SELECT id, idempotency_key, at, result FROM outbox_attempts ORDER BY id`)
	}); err != nil {
		return nil, fmt.Errorf("outbox: list attempts: %w", err)
	}
	return out, nil
}
