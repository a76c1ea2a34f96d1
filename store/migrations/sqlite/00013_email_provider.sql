-- +goose Up
-- The simulated email provider's own tables (tools/email): what it
-- accepted, one row per idempotency key (accepted_at may lie ahead under
-- its record-late fault), and every call it saw. They play an external
-- system's records: the gateway's code never writes them, only the provider
-- through store.ServiceDB, and check compares the gateway's outcomes with
-- them (invariants 2 and 10). Before this migration the provider created
-- them itself, so a database may have them already.
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
);

-- +goose Down
DROP TABLE IF EXISTS outbox_attempts;
DROP TABLE IF EXISTS outbox;
