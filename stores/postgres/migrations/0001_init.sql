-- Abhyasa PostgreSQL store, schema version 1.
--
-- Many agents share one database: every row belongs to one partition (the
-- agent id), and every read and write names its partition, so each is served
-- by a primary-key index prefix and never sees another agent's rows.

-- Who may write a partition. A node takes the row at start (epoch + 1),
-- renews `lease_until` while it runs, and every commit re-checks its epoch
-- inside its own transaction (the row lock orders it against a takeover), so
-- a stale owner's commit is refused, never applied. Leases are measured on
-- the database clock (now()); node clocks do not matter.
CREATE TABLE abhyasa_owners (
    partition   text        PRIMARY KEY,
    holder      text        NOT NULL,
    epoch       bigint      NOT NULL CHECK (epoch > 0),
    lease_until timestamptz NOT NULL,
    taken_at    timestamptz NOT NULL DEFAULT now()
);

-- The custody tables of the embedded stores (custody_pending,
-- custody_terminal, escalations, reconciliations, principal,
-- receiver_ledger, receiver_key_sequences, receiver_effects, intents,
-- events, meta, quarantine), one slice per (partition, tbl). Keys and values
-- are the embedded stores' own encodings (written and read back by the same
-- code, abhyasa_store::kv), so every backend keeps the same rules. `epoch`
-- is the owner epoch that wrote the row: after a takeover no row carries a
-- stale owner's epoch unless it was written before the takeover.
CREATE TABLE abhyasa_rows (
    partition text   NOT NULL,
    tbl       text   NOT NULL,
    key       bytea  NOT NULL,
    value     bytea  NOT NULL,
    epoch     bigint NOT NULL,
    PRIMARY KEY (partition, tbl, key)
);
