package store

// Sign-in through an OpenID Connect provider: the identities that map a
// provider's person (issuer + subject) to a user, and the sign-ins started
// at a provider and not yet finished. Package auth decides everything
// (what a state is, how a name is made, what a token must say); the store
// keeps rows and makes each step one transaction.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// BeginOIDCLogin records a sign-in started at a provider, under the hash
// of its state, with where to go afterwards (next) and the client address
// that started it; it is usable until expires. Rows that expired are
// dropped first. A new row is refused with rate_limited while addr already
// has perAddr sign-ins in flight or everyone together has total, so that
// no client can fill the table.
func (a Accounts) BeginOIDCLogin(ctx context.Context, stateHash, next, addr string, expires time.Time,
	perAddr, total int) error {
	return a.s.write(ctx, func(t *txn) error {
		if _, err := t.exec(`DELETE FROM oidc_logins WHERE expires_at <= ?`, ms(t.now)); err != nil {
			return fmt.Errorf("drop expired sign-ins: %w", err)
		}
		var fromAddr, all int
		if err := t.get(&fromAddr, `SELECT COUNT(*) FROM oidc_logins WHERE addr = ?`, addr); err != nil {
			return fmt.Errorf("count sign-ins: %w", err)
		}
		if err := t.get(&all, `SELECT COUNT(*) FROM oidc_logins`); err != nil {
			return fmt.Errorf("count sign-ins: %w", err)
		}
		if fromAddr >= perAddr || all >= total {
			return chat.Errorf(chat.CodeRateLimited,
				"too many sign-ins were started and not finished: finish one, or wait a minute and start again").
				With("retry_after_seconds", 60)
		}
		if _, err := t.exec(`INSERT INTO oidc_logins (state_hash, next, addr, created_at, expires_at)
			VALUES (?, ?, ?, ?, ?)`, stateHash, next, addr, ms(t.now), ms(expires)); err != nil {
			return fmt.Errorf("begin sign-in: %w", err)
		}
		return nil
	})
}

// TakeOIDCLogin ends the sign-in recorded under stateHash and returns its
// next: once only. An unknown state, one taken before, or one expired at
// now answers not_found.
func (a Accounts) TakeOIDCLogin(ctx context.Context, stateHash string, now time.Time) (string, error) {
	var next string
	err := a.s.write(ctx, func(t *txn) error {
		var row struct {
			Next      string `db:"next"`
			ExpiresAt int64  `db:"expires_at"`
		}
		err := t.get(&row, `DELETE FROM oidc_logins WHERE state_hash = ? RETURNING next, expires_at`, stateHash)
		if errors.Is(err, sql.ErrNoRows) {
			return chat.Errorf(chat.CodeNotFound, "no such sign-in")
		}
		if err != nil {
			return fmt.Errorf("take sign-in: %w", err)
		}
		if row.ExpiresAt <= ms(now) {
			return chat.Errorf(chat.CodeNotFound, "the sign-in expired")
		}
		next = row.Next
		return nil
	})
	return next, err
}

// SignInIdentity returns the active user of the person subject at the
// provider issuer, creating one on the first sign-in: named by the first of names that no active account has,
// without a password. created says which; passwordHash is the user's
// ("" when it has none). The e-mail address (as the provider gives it
// now, "" for none) and the time are recorded on the identity each time; the name is never changed. When every name is
// taken the answer is invalid_request. An identity whose user was deleted
// is given a new user (DeleteUser removes identities, so that happens only
// to rows written before it did).
func (a Accounts) SignInIdentity(ctx context.Context, issuer, subject, email string, names []string) (
	u chat.User, passwordHash string, created bool, err error) {
	for attempt := 0; ; attempt++ {
		u, passwordHash, created, err = a.signInIdentity(ctx, identity{issuer, subject, email}, names)
		// Two first sign-ins of one person at once (two instances, or two
		// tabs): one inserts, the other then finds it.
		if attempt == 0 && isUniqueViolation(err) {
			continue
		}
		return u, passwordHash, created, err
	}
}

// identity is a person at a provider as a sign-in names them.
type identity struct{ Issuer, Subject, Email string }

func (a Accounts) signInIdentity(ctx context.Context, id identity, names []string) (
	u chat.User, passwordHash string, created bool, err error) {
	err = a.s.write(ctx, func(t *txn) error {
		var r userRow
		err := t.get(&r, `SELECT u.user_id, u.name, u.created_at, u.password_hash
			FROM identities i JOIN users u ON u.user_id = i.user_id
			WHERE i.issuer = ? AND i.subject = ? AND u.deleted_at IS NULL`, id.Issuer, id.Subject)
		switch {
		case err == nil:
			if _, err := t.exec(`UPDATE identities SET email = ?, last_seen_at = ? WHERE issuer = ? AND subject = ?`,
				nullStr(id.Email), ms(t.now), id.Issuer, id.Subject); err != nil {
				return fmt.Errorf("record sign-in: %w", err)
			}
			u, passwordHash, created = r.user(), r.PasswordHash.String, false
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("load identity: %w", err)
		}
		if _, err := t.exec(`DELETE FROM identities WHERE issuer = ? AND subject = ?`, id.Issuer, id.Subject); err != nil {
			return fmt.Errorf("drop identity of a deleted user: %w", err)
		}
		name, err := t.freeName(names)
		if err != nil {
			return err
		}
		r = userRow{UserID: chat.NewID(chat.PrefixUser), Name: name, CreatedAt: ms(t.now)}
		if _, err := t.exec(`INSERT INTO users (user_id, name, created_at) VALUES (?, ?, ?)`,
			r.UserID, r.Name, r.CreatedAt); err != nil {
			return fmt.Errorf("create user: %w", err)
		}
		if _, err := t.exec(`INSERT INTO identities (issuer, subject, user_id, email, created_at, last_seen_at)
			VALUES (?, ?, ?, ?, ?, ?)`, id.Issuer, id.Subject, r.UserID, nullStr(id.Email), ms(t.now), ms(t.now)); err != nil {
			return fmt.Errorf("create identity: %w", err)
		}
		u, passwordHash, created = r.user(), "", true
		return nil
	})
	return u, passwordHash, created, err
}

// freeName is the first of names no active account has.
func (t *txn) freeName(names []string) (string, error) {
	for _, name := range names {
		var n int
		if err := t.get(&n, `SELECT COUNT(*) FROM users WHERE name = ? AND deleted_at IS NULL`, name); err != nil {
			return "", fmt.Errorf("look up name: %w", err)
		}
		if n == 0 {
			return name, nil
		}
	}
	return "", chat.Invalid("every user name proposed for the new account (%d) is taken", len(names))
}
