-- +goose Up
-- Accounts: password sign-in, sessions and API tokens. Secrets are never
-- stored: a session is keyed by the SHA-256 of its cookie value, a token by
-- its id with the SHA-256 of its secret, a password by its bcrypt hash.
-- A deleted user keeps its row (its threads still name it) but loses every
-- credential; its name may be given to a new account.

ALTER TABLE users ADD COLUMN password_hash TEXT;
ALTER TABLE users ADD COLUMN deleted_at BIGINT;

CREATE UNIQUE INDEX users_active_name ON users (name) WHERE deleted_at IS NULL;

CREATE TABLE sessions (
    session_hash TEXT PRIMARY KEY,
    user_id      TEXT NOT NULL REFERENCES users (user_id),
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL
);

CREATE INDEX sessions_by_user ON sessions (user_id);
CREATE INDEX sessions_by_expiry ON sessions (expires_at);

CREATE TABLE api_tokens (
    token_id    TEXT PRIMARY KEY,
    user_id     TEXT NOT NULL REFERENCES users (user_id),
    name        TEXT NOT NULL,
    secret_hash TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT,
    revoked_at  BIGINT
);

CREATE INDEX api_tokens_by_user ON api_tokens (user_id);

-- +goose Down
DROP TABLE api_tokens;
DROP TABLE sessions;
DROP INDEX users_active_name;
ALTER TABLE users DROP COLUMN deleted_at;
ALTER TABLE users DROP COLUMN password_hash;
