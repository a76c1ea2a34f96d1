package tools

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/mattn/go-sqlite3" // the "sqlite3" driver
)

// Outbox faults, for OutboxConfig.Fault.
const (
	// FaultNone: every call behaves.
	FaultNone = ""
	// FaultReject: the provider refuses a new key; nothing is accepted and
	// Send returns ErrRejected.
	FaultReject = "reject"
	// FaultAcceptThenTimeout: the provider accepts and records the key,
	// then the answer is lost: Send returns an error wrapping
	// context.DeadlineExceeded.
	FaultAcceptThenTimeout = "accept-then-timeout"
	// FaultCrash: the provider accepts and records the key, then
	// CrashFunc runs, as if the gateway died before hearing the answer.
	FaultCrash = "crash"
)

// ErrSimulatedCrash is what Send returns under FaultCrash when CrashFunc
// returns (a test's CrashFunc that only records).
var ErrSimulatedCrash = errors.New("outbox: simulated crash after the provider accepted")

// OutboxConfig configures the simulated email provider.
type OutboxConfig struct {
	// Latency is waited (honouring ctx) before the provider sees a call.
	Latency time.Duration
	// Fault is one of FaultNone, FaultReject, FaultAcceptThenTimeout,
	// FaultCrash.
	Fault string
	// FaultEvery applies Fault to calls 1, 1+N, 1+2N, … of this Outbox
	// (counting every Send), so with N = 2 the first call fails and the
	// second succeeds. 0 or 1: every call.
	FaultEvery int
	// CrashFunc is called under FaultCrash; nil means os.Exit(3).
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
)

// Outbox plays an external email provider that honours idempotency keys:
// it keeps its own table (outbox) in the SQLite file it is given, on its
// own connection, accepts each key at most once, and records every call
// in outbox_attempts. It is safe for concurrent use.
//
// Once a call has reached the provider (after Latency), it is processed
// to the end even if the caller's ctx ends meanwhile, as a remote system
// would. A key it already accepted is always answered with its
// provider_id (it never claims to reject what it did); the lost-answer and
// crash faults still apply to such repeats.
type Outbox struct {
	db    *sqlx.DB
	cfg   OutboxConfig
	calls atomic.Int64
}

const outboxSchema = `
CREATE TABLE IF NOT EXISTS outbox (
	idempotency_key TEXT PRIMARY KEY,
	recipient TEXT NOT NULL,
	subject TEXT NOT NULL,
	body TEXT NOT NULL,
	provider_id TEXT NOT NULL,
	accepted_at BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS outbox_attempts (
	id INTEGER PRIMARY KEY AUTOINCREMENT,
	idempotency_key TEXT NOT NULL,
	at BIGINT NOT NULL,
	result TEXT NOT NULL
);`

// OpenOutbox opens the provider's tables in the SQLite file at path,
// creating them if missing.
func OpenOutbox(path string, cfg OutboxConfig) (*Outbox, error) {
	switch cfg.Fault {
	case FaultNone, FaultReject, FaultAcceptThenTimeout, FaultCrash:
	default:
		return nil, fmt.Errorf("outbox: unknown fault %q", cfg.Fault)
	}
	if cfg.FaultEvery < 0 {
		return nil, fmt.Errorf("outbox: negative FaultEvery %d", cfg.FaultEvery)
	}
	if path == "" {
		return nil, errors.New("outbox: empty database path")
	}
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() + "?_journal_mode=WAL&_busy_timeout=5000"
	db, err := sqlx.Open("sqlite3", dsn)
	if err != nil {
		return nil, fmt.Errorf("outbox: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	if _, err := db.Exec(outboxSchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("outbox: create tables in %s: %w", path, err)
	}
	return &Outbox{db: db, cfg: cfg}, nil
}

// Close closes the connection.
func (o *Outbox) Close() error { return o.db.Close() }

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
// during Latency (nothing reached the provider), ErrRejected under
// FaultReject (nothing accepted), or, with the key accepted, an error
// wrapping context.DeadlineExceeded (FaultAcceptThenTimeout) or
// ErrSimulatedCrash (FaultCrash, if CrashFunc returns).
func (o *Outbox) Send(ctx context.Context, key string, msg Email) (string, error) {
	if key == "" {
		return "", errors.New("outbox: empty idempotency key")
	}
	call := o.calls.Add(1)
	fault := ""
	if o.faulty(call) {
		fault = o.cfg.Fault
	}
	if err := wait(ctx, o.cfg.Latency); err != nil {
		// The request never reached the provider; record the call anyway.
		_ = o.recordAttempt(context.WithoutCancel(ctx), key, AttemptCancelled)
		return "", err
	}
	// From here on the provider is processing the call: it finishes even
	// if the caller stops waiting.
	pctx := context.WithoutCancel(ctx)

	if fault == FaultReject {
		id, found, err := o.Lookup(pctx, key)
		if err != nil {
			return "", err
		}
		if !found {
			if err := o.recordAttempt(pctx, key, AttemptRejected); err != nil {
				return "", err
			}
			return "", fmt.Errorf("outbox: key %s: %w", key, ErrRejected)
		}
		if err := o.recordAttempt(pctx, key, AttemptDuplicate); err != nil {
			return "", err
		}
		return id, nil
	}

	id, err := o.accept(pctx, key, msg)
	if err != nil {
		return "", err
	}
	switch fault {
	case FaultAcceptThenTimeout:
		return "", fmt.Errorf("outbox: no answer from the email provider for key %s: %w", key, context.DeadlineExceeded)
	case FaultCrash:
		crash := o.cfg.CrashFunc
		if crash == nil {
			crash = func() { os.Exit(3) }
		}
		crash()
		return "", ErrSimulatedCrash
	}
	return id, nil
}

// accept records key once, and the attempt, in one transaction. The first
// statement writes, so the transaction takes SQLite's write lock at once
// (no read-to-write upgrade that could fail with SQLITE_BUSY).
func (o *Outbox) accept(ctx context.Context, key string, msg Email) (string, error) {
	tx, err := o.db.BeginTxx(ctx, nil)
	if err != nil {
		return "", fmt.Errorf("outbox: begin: %w", err)
	}
	defer tx.Rollback()
	now := time.Now().UnixMilli()
	r, err := tx.ExecContext(ctx, `INSERT INTO outbox (idempotency_key, recipient, subject, body, provider_id, accepted_at)
		VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (idempotency_key) DO NOTHING`,
		key, msg.To, msg.Subject, msg.Body, newProviderID(), now)
	if err != nil {
		return "", fmt.Errorf("outbox: accept %s: %w", key, err)
	}
	n, err := r.RowsAffected()
	if err != nil {
		return "", fmt.Errorf("outbox: accept %s: %w", key, err)
	}
	result := AttemptAccepted
	if n == 0 {
		result = AttemptDuplicate
	}
	var id string
	if err := tx.GetContext(ctx, &id, `SELECT provider_id FROM outbox WHERE idempotency_key = ?`, key); err != nil {
		return "", fmt.Errorf("outbox: read back %s: %w", key, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO outbox_attempts (idempotency_key, at, result) VALUES (?, ?, ?)`,
		key, now, result); err != nil {
		return "", fmt.Errorf("outbox: record attempt for %s: %w", key, err)
	}
	if err := tx.Commit(); err != nil {
		return "", fmt.Errorf("outbox: commit %s: %w", key, err)
	}
	return id, nil
}

func (o *Outbox) recordAttempt(ctx context.Context, key, result string) error {
	_, err := o.db.ExecContext(ctx, `INSERT INTO outbox_attempts (idempotency_key, at, result) VALUES (?, ?, ?)`,
		key, time.Now().UnixMilli(), result)
	if err != nil {
		return fmt.Errorf("outbox: record attempt for %s: %w", key, err)
	}
	return nil
}

// Lookup returns the provider_id of key, if the provider accepted it.
func (o *Outbox) Lookup(ctx context.Context, key string) (providerID string, found bool, err error) {
	err = o.db.GetContext(ctx, &providerID, `SELECT provider_id FROM outbox WHERE idempotency_key = ?`, key)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("outbox: look up %s: %w", key, err)
	}
	return providerID, true, nil
}

// Accepted reports the keys the provider holds as accepted (one row per
// key by its primary key: how often a key was accepted is in Attempts).
func (o *Outbox) Accepted(ctx context.Context) (map[string]bool, error) {
	var keys []string
	if err := o.db.SelectContext(ctx, &keys, `SELECT idempotency_key FROM outbox`); err != nil {
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
	if err := o.db.SelectContext(ctx, &out,
		`SELECT id, idempotency_key, at, result FROM outbox_attempts ORDER BY id`); err != nil {
		return nil, fmt.Errorf("outbox: list attempts: %w", err)
	}
	return out, nil
}

// wait sleeps d or until ctx ends, whichever is first.
func wait(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
