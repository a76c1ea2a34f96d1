-- +goose Up
-- Sign-in through an OpenID Connect provider (docs/accounts.md, "Sign in
-- with OpenID Connect").
--
-- identities: who a user is at a provider. A user is found by the
-- provider's issuer and its subject (the provider's stable id of the
-- person), never by e-mail or name: an address that changes at the
-- provider changes nothing here (email only records the last one seen).
-- Deleting the user (`gateway user del`) removes its identities.
CREATE TABLE identities (
    issuer       TEXT NOT NULL,
    subject      TEXT NOT NULL,
    user_id      TEXT NOT NULL REFERENCES users (user_id),
    email        TEXT,
    created_at   BIGINT NOT NULL,
    last_seen_at BIGINT NOT NULL,
    PRIMARY KEY (issuer, subject)
);
CREATE INDEX identities_by_user ON identities (user_id);

-- oidc_logins: the sign-ins started and not yet finished, one row each,
-- keyed by the SHA-256 of its state (the random value the provider sends
-- back). A callback takes its row away (single use); rows live minutes.
-- Nothing secret is kept: the PKCE verifier and the nonce are derived
-- from a secret held only in the browser's cookie. addr is the client
-- address that started it (a bound per address on rows in flight).
CREATE TABLE oidc_logins (
    state_hash TEXT PRIMARY KEY,
    next       TEXT NOT NULL,
    addr       TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX oidc_logins_by_expiry ON oidc_logins (expires_at);
CREATE INDEX oidc_logins_by_addr ON oidc_logins (addr);

-- +goose Down
DROP TABLE oidc_logins;
DROP TABLE identities;
