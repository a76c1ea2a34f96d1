package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// Accounts is the store's part that keeps users, sessions and API tokens
// (package auth's Store; the user and token subcommands). It keeps hashes
// only: hashing, name rules and sign-in policy belong to package auth. Its
// writes take the store's one writer like every other. A value, safe for
// concurrent use, valid until the store is closed.
type Accounts struct{ s *Store }

// Accounts returns the store's accounts.
func (s *Store) Accounts() Accounts { return Accounts{s: s} }

type userRow struct {
	UserID       string         `db:"user_id"`
	Name         string         `db:"name"`
	CreatedAt    int64          `db:"created_at"`
	PasswordHash sql.NullString `db:"password_hash"`
}

const userCols = `user_id, name, created_at, password_hash`

func (r userRow) user() chat.User {
	return chat.User{UserID: r.UserID, Name: r.Name, CreatedAt: fromMS(r.CreatedAt), HasPassword: r.PasswordHash.Valid}
}

func noUser(name string) error {
	return chat.Errorf(chat.CodeNotFound, "no user %q: list them with `gateway user list`", name)
}

// CreateUser adds an account; passwordHash "" makes one that cannot sign in
// with a password (header mode, tokens only). A name in use by an active
// account is refused.
func (a Accounts) CreateUser(ctx context.Context, name, passwordHash string) (chat.User, error) {
	s := a.s
	var out chat.User
	err := s.write(ctx, func(t *txn) error {
		r := userRow{UserID: chat.NewID(chat.PrefixUser), Name: name, CreatedAt: ms(t.now),
			PasswordHash: sql.NullString{String: passwordHash, Valid: passwordHash != ""}}
		_, err := t.exec(`INSERT INTO users (user_id, name, created_at, password_hash) VALUES (?, ?, ?, ?)`,
			r.UserID, r.Name, r.CreatedAt, r.PasswordHash)
		if isUniqueViolation(err) {
			return chat.Invalid(
				"user %q already exists: pick another name, or change its password with `gateway user passwd %s`",
				name, name,
			)
		}
		if err != nil {
			return fmt.Errorf("create user: %w", err)
		}
		out = r.user()
		return nil
	})
	return out, err
}

// EnsureUser returns the active account called name, creating it (without a
// password) when there is none. Used by header mode, where the trusted proxy
// decides who exists.
func (a Accounts) EnsureUser(ctx context.Context, name string) (chat.User, error) {
	u, _, err := a.UserByName(ctx, name)
	if chat.ErrorCode(err) != chat.CodeNotFound {
		return u, err
	}
	u, err = a.CreateUser(ctx, name, "")
	if chat.ErrorCode(err) == chat.CodeInvalidRequest {
		// Created by a concurrent request in between? (Otherwise the name
		// itself was refused: that error stands.)
		if again, _, aerr := a.UserByName(ctx, name); aerr == nil {
			return again, nil
		}
	}
	return u, err
}

// UserByName returns the active account called name and its password hash
// ("" when it has none).
func (a Accounts) UserByName(ctx context.Context, name string) (chat.User, string, error) {
	s := a.s
	var r userRow
	err := s.reader.GetContext(
		ctx, &r,
		s.reader.Rebind(`SELECT `+userCols+` FROM users WHERE name = ? AND deleted_at IS NULL`),
		name,
	)
	if errors.Is(err, sql.ErrNoRows) {
		return chat.User{}, "", noUser(name)
	}
	if err != nil {
		return chat.User{}, "", fmt.Errorf("load user: %w", err)
	}
	return r.user(), r.PasswordHash.String, nil
}

// Users lists the active accounts by name.
func (a Accounts) Users(ctx context.Context) ([]chat.User, error) {
	s := a.s
	var rows []userRow
	if err := s.reader.SelectContext(ctx, &rows, `SELECT `+userCols+` FROM users WHERE deleted_at IS NULL
		ORDER BY name`); err != nil {
		return nil, fmt.Errorf("list users: %w", err)
	}
	out := make([]chat.User, len(rows))
	for i, r := range rows {
		out[i] = r.user()
	}
	return out, nil
}

// SetPassword replaces an account's password hash and ends every session
// of that account in the same transaction.
func (a Accounts) SetPassword(ctx context.Context, name, passwordHash string) error {
	_, err := a.ResetPassword(ctx, name, passwordHash, false)
	return err
}

// ResetPassword is SetPassword that, with revokeTokens, also revokes every
// live API token of the account, in the same transaction; it returns how
// many it revoked.
func (a Accounts) ResetPassword(ctx context.Context, name, passwordHash string, revokeTokens bool) (int, error) {
	var revoked int
	err := a.writeForUser(ctx, name, func(t *txn, id string) error {
		if _, err := t.exec(`UPDATE users SET password_hash = ? WHERE user_id = ?`, passwordHash, id); err != nil {
			return fmt.Errorf("set password: %w", err)
		}
		if _, err := t.exec(`DELETE FROM sessions WHERE user_id = ?`, id); err != nil {
			return fmt.Errorf("end sessions: %w", err)
		}
		revoked = 0
		if revokeTokens {
			n, err := t.revokeTokens(id)
			if err != nil {
				return err
			}
			revoked = n
		}
		return nil
	})
	return revoked, err
}

// revokeTokens revokes the live tokens of user id and says how many.
func (t *txn) revokeTokens(id string) (int, error) {
	res, err := t.exec(
		`UPDATE api_tokens SET revoked_at = ? WHERE user_id = ? AND revoked_at IS NULL AND (expires_at IS NULL
			OR expires_at > ?)`,
		ms(t.now), id, ms(t.now),
	)
	if err != nil {
		return 0, fmt.Errorf("revoke tokens: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("revoke tokens: %w", err)
	}
	return int(n), nil
}

// Sessions lists the unexpired sessions of the active account name, oldest
// first: when each began and ends, nothing that could be presented.
func (a Accounts) Sessions(ctx context.Context, name string, now time.Time) ([]chat.Session, error) {
	s := a.s
	if _, _, err := a.UserByName(ctx, name); err != nil {
		return nil, err
	}
	var rows []struct {
		CreatedAt int64 `db:"created_at"`
		ExpiresAt int64 `db:"expires_at"`
	}
	if err := s.reader.SelectContext(ctx, &rows, s.reader.Rebind(`SELECT s.created_at, s.expires_at
		FROM sessions s JOIN users u ON u.user_id = s.user_id
		WHERE u.name = ? AND u.deleted_at IS NULL AND s.expires_at > ?
		ORDER BY s.created_at, s.expires_at`), name, ms(now)); err != nil {
		return nil, fmt.Errorf("list sessions: %w", err)
	}
	out := make([]chat.Session, len(rows))
	for i, r := range rows {
		out[i] = chat.Session{CreatedAt: fromMS(r.CreatedAt), ExpiresAt: fromMS(r.ExpiresAt)}
	}
	return out, nil
}

// EndSessions ends every session of the active account name at once (its
// API tokens stay) and says how many were unexpired.
func (a Accounts) EndSessions(ctx context.Context, name string) (int, error) {
	var ended int
	err := a.writeForUser(ctx, name, func(t *txn, id string) error {
		var live int
		if err := t.get(&live, `SELECT COUNT(*) FROM sessions WHERE user_id = ? AND expires_at > ?`,
			id, ms(t.now)); err != nil {
			return fmt.Errorf("count sessions: %w", err)
		}
		if _, err := t.exec(`DELETE FROM sessions WHERE user_id = ?`, id); err != nil {
			return fmt.Errorf("end sessions: %w", err)
		}
		ended = live
		return nil
	})
	return ended, err
}

// DeleteUser removes an account's credentials: its password, sessions,
// tokens and provider identities go at once. Its threads stay
// (unreachable) until retention purges them; its name is free for a new
// account, which does not see them (nor does the account a later sign-in
// through the provider creates).
func (a Accounts) DeleteUser(ctx context.Context, name string) error {
	return a.writeForUser(ctx, name, func(t *txn, id string) error {
		if _, err := t.exec(`UPDATE users SET deleted_at = ?, password_hash = NULL WHERE user_id = ?`,
			ms(t.now), id); err != nil {
			return fmt.Errorf("delete user: %w", err)
		}
		if _, err := t.exec(`DELETE FROM sessions WHERE user_id = ?`, id); err != nil {
			return fmt.Errorf("end sessions: %w", err)
		}
		if _, err := t.exec(`UPDATE api_tokens SET revoked_at = ? WHERE user_id = ? AND revoked_at IS NULL`,
			ms(t.now), id); err != nil {
			return fmt.Errorf("revoke tokens: %w", err)
		}
		if _, err := t.exec(`DELETE FROM identities WHERE user_id = ?`, id); err != nil {
			return fmt.Errorf("remove identities: %w", err)
		}
		return nil
	})
}

// writeForUser runs do in a write transaction with the id of the active
// account name; without one it answers activeUser's error.
func (a Accounts) writeForUser(ctx context.Context, name string, do func(t *txn, id string) error) error {
	return a.s.write(ctx, func(t *txn) error {
		id, err := t.activeUser(name)
		if err != nil {
			return err
		}
		return do(t, id)
	})
}

func (t *txn) activeUser(name string) (string, error) {
	var id string
	err := t.get(&id, `SELECT user_id FROM users WHERE name = ? AND deleted_at IS NULL`, name)
	if errors.Is(err, sql.ErrNoRows) {
		return "", noUser(name)
	}
	if err != nil {
		return "", fmt.Errorf("load user: %w", err)
	}
	return id, nil
}

// CreateSession stores a session of userID under the hash of its cookie
// value, and drops sessions that expired.
func (a Accounts) CreateSession(ctx context.Context, sessionHash, userID string, expires time.Time) error {
	s := a.s
	return s.write(ctx, func(t *txn) error {
		if _, err := t.exec(`DELETE FROM sessions WHERE expires_at <= ?`, ms(t.now)); err != nil {
			return fmt.Errorf("drop expired sessions: %w", err)
		}
		if _, err := t.exec(`INSERT INTO sessions (session_hash, user_id, created_at, expires_at) VALUES (?, ?, ?, ?)`,
			sessionHash, userID, ms(t.now), ms(expires)); err != nil {
			return fmt.Errorf("create session: %w", err)
		}
		return nil
	})
}

// SessionUser returns the active account of an unexpired session, or
// not_found.
func (a Accounts) SessionUser(ctx context.Context, sessionHash string, now time.Time) (chat.User, error) {
	u, _, err := a.SessionUntil(ctx, sessionHash, now)
	return u, err
}

// SessionUntil is SessionUser that also says when the session expires.
func (a Accounts) SessionUntil(ctx context.Context, sessionHash string, now time.Time) (chat.User, time.Time, error) {
	s := a.s
	var r struct {
		userRow
		ExpiresAt int64 `db:"expires_at"`
	}
	err := s.reader.GetContext(
		ctx, &r,
		s.reader.Rebind(`SELECT u.user_id, u.name, u.created_at, u.password_hash, s.expires_at
		FROM sessions s JOIN users u ON u.user_id = s.user_id
		WHERE s.session_hash = ? AND s.expires_at > ? AND u.deleted_at IS NULL`),
		sessionHash, ms(now),
	)
	if errors.Is(err, sql.ErrNoRows) {
		return chat.User{}, time.Time{}, chat.Errorf(chat.CodeNotFound, "no such session")
	}
	if err != nil {
		return chat.User{}, time.Time{}, fmt.Errorf("load session: %w", err)
	}
	return r.userRow.user(), fromMS(r.ExpiresAt), nil
}

// DeleteSession ends one session (sign out). Ending an unknown session is
// not an error.
func (a Accounts) DeleteSession(ctx context.Context, sessionHash string) error {
	s := a.s
	return s.write(ctx, func(t *txn) error {
		if _, err := t.exec(`DELETE FROM sessions WHERE session_hash = ?`, sessionHash); err != nil {
			return fmt.Errorf("delete session: %w", err)
		}
		return nil
	})
}

type tokenRow struct {
	TokenID   string        `db:"token_id"`
	UserID    string        `db:"user_id"`
	UserName  string        `db:"user_name"`
	Name      string        `db:"name"`
	CreatedAt int64         `db:"created_at"`
	ExpiresAt sql.NullInt64 `db:"expires_at"`
	RevokedAt sql.NullInt64 `db:"revoked_at"`
}

func (r tokenRow) token() chat.APIToken {
	return chat.APIToken{
		TokenID:   r.TokenID,
		UserID:    r.UserID,
		UserName:  r.UserName,
		Name:      r.Name,
		CreatedAt: fromMS(r.CreatedAt),
		ExpiresAt: fromNullMS(r.ExpiresAt),
		RevokedAt: fromNullMS(r.RevokedAt),
	}
}

// CreateToken stores an API token of the active account userName under the
// hash of its secret. tok.TokenID must be set; a zero ExpiresAt never
// expires.
func (a Accounts) CreateToken(
	ctx context.Context,
	userName string,
	tok chat.APIToken,
	secretHash string,
) (chat.APIToken, error) {
	err := a.writeForUser(ctx, userName, func(t *txn, id string) error {
		tok.UserID, tok.CreatedAt = id, t.now.Truncate(time.Millisecond).UTC()
		var expires sql.NullInt64
		if tok.ExpiresAt != nil {
			expires = sql.NullInt64{Int64: ms(*tok.ExpiresAt), Valid: true}
		}
		if _, err := t.exec(`INSERT INTO api_tokens (token_id, user_id, name, secret_hash, created_at, expires_at)
			VALUES (?, ?, ?, ?, ?, ?)`,
			tok.TokenID, id, tok.Name, secretHash, ms(t.now), expires); err != nil {
			return fmt.Errorf("create token: %w", err)
		}
		return nil
	})
	return tok, err
}

// TokenUser returns the account of a live (unrevoked, unexpired) token and
// the token's secret hash for the caller to compare, or not_found.
func (a Accounts) TokenUser(ctx context.Context, tokenID string, now time.Time) (chat.User, string, error) {
	u, hash, _, err := a.TokenUntil(ctx, tokenID, now)
	return u, hash, err
}

// TokenUntil is TokenUser that also says when the token expires (the zero
// time: never).
func (a Accounts) TokenUntil(ctx context.Context, tokenID string, now time.Time) (chat.User, string, time.Time, error) {
	s := a.s
	var r struct {
		userRow
		SecretHash string        `db:"secret_hash"`
		ExpiresAt  sql.NullInt64 `db:"expires_at"`
	}
	err := s.reader.GetContext(
		ctx, &r,
		s.reader.Rebind(`SELECT u.user_id, u.name, u.created_at, u.password_hash, t.secret_hash, t.expires_at
		FROM api_tokens t JOIN users u ON u.user_id = t.user_id
		WHERE t.token_id = ? AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > ?)
		AND u.deleted_at IS NULL`),
		tokenID, ms(now),
	)
	if errors.Is(err, sql.ErrNoRows) {
		return chat.User{}, "", time.Time{}, chat.Errorf(chat.CodeNotFound, "no such token")
	}
	if err != nil {
		return chat.User{}, "", time.Time{}, fmt.Errorf("load token: %w", err)
	}
	var expires time.Time
	if r.ExpiresAt.Valid {
		expires = fromMS(r.ExpiresAt.Int64)
	}
	return r.userRow.user(), r.SecretHash, expires, nil
}

// RevokeToken revokes a token at once; revoking it again is not an error.
func (a Accounts) RevokeToken(ctx context.Context, tokenID string) error {
	s := a.s
	return s.write(ctx, func(t *txn) error {
		res, err := t.exec(
			`UPDATE api_tokens SET revoked_at = COALESCE(revoked_at, ?) WHERE token_id = ?`,
			ms(t.now), tokenID,
		)
		if err != nil {
			return fmt.Errorf("revoke token: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return chat.Errorf(chat.CodeNotFound, "no token %q: list them with `gateway token list`", tokenID)
		}
		return nil
	})
}

// Tokens lists the tokens of every account, or of one when userName is set,
// newest first. Secrets are never returned (only their hashes exist).
func (a Accounts) Tokens(ctx context.Context, userName string) ([]chat.APIToken, error) {
	s := a.s
	q := `SELECT t.token_id, t.user_id, u.name AS user_name, t.name, t.created_at, t.expires_at, t.revoked_at
		FROM api_tokens t JOIN users u ON u.user_id = t.user_id`
	var args []any
	if userName != "" {
		q += ` WHERE u.name = ? AND u.deleted_at IS NULL`
		args = append(args, userName)
	}
	var rows []tokenRow
	if err := s.reader.SelectContext(ctx, &rows, s.reader.Rebind(q+` ORDER BY t.created_at DESC, t.token_id DESC`),
		args...); err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	out := make([]chat.APIToken, len(rows))
	for i, r := range rows {
		out[i] = r.token()
	}
	return out, nil
}
