//! Versioned schema migrations, applied at open under an advisory lock so
//! that many nodes starting against one database migrate it once.

use abhyasa_core::store::StoreError;
use postgres::Client;

use crate::pg_err;

/// Every migration this build knows, in order: (version, name, SQL).
const MIGRATIONS: &[(i32, &str, &str)] =
    &[(1, "0001_init", include_str!("../migrations/0001_init.sql"))];

/// The newest schema version this build reads and writes.
pub const SCHEMA_VERSION: u32 = 1;

/// Any stable 64-bit number: the advisory lock that serializes migrators.
const MIGRATION_LOCK: i64 = 0x6162_6879_6173_6131; // "abhyasa1"

/// Brings the schema to [`SCHEMA_VERSION`]. A database migrated by a newer
/// build is refused with [`StoreError::NewerFormat`] and left untouched.
pub(crate) fn migrate(client: &mut Client) -> Result<u32, StoreError> {
    let mut tx = client.transaction().map_err(pg_err("begin migration"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .map_err(pg_err("lock migrations"))?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS abhyasa_migrations (
             version    integer     PRIMARY KEY,
             name       text        NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .map_err(pg_err("create migrations table"))?;
    let found: i32 = tx
        .query_one(
            "SELECT coalesce(max(version), 0) FROM abhyasa_migrations",
            &[],
        )
        .map_err(pg_err("read schema version"))?
        .get(0);
    let found = u32::try_from(found).unwrap_or(0);
    if found > SCHEMA_VERSION {
        return Err(StoreError::NewerFormat {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (version, name, sql) in MIGRATIONS {
        if u32::try_from(*version).unwrap_or(0) <= found {
            continue;
        }
        tx.batch_execute(sql).map_err(pg_err("apply migration"))?;
        tx.execute(
            "INSERT INTO abhyasa_migrations (version, name) VALUES ($1, $2)",
            &[version, name],
        )
        .map_err(pg_err("record migration"))?;
    }
    tx.commit().map_err(pg_err("commit migration"))?;
    Ok(SCHEMA_VERSION)
}
