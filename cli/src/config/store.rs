//! The store keys: which store, where, and on PostgreSQL how this node
//! holds its agent's partition.

use std::path::{Path, PathBuf};
use std::time::Duration;

use abhyasa_store::StoreKind;

use super::file::{bad, NodeConfig};
use super::resolved::PgSettings;

/// Shortest `postgres_lease_ms` accepted: renewals run every third of it.
const MIN_PG_LEASE_MS: u64 = 300;

/// The store this config opens: its kind and path, or PostgreSQL's
/// settings when `store = "postgres"` (then kind and path are unused).
pub(super) fn resolve(
    c: &NodeConfig,
    dir: &Path,
) -> Result<(StoreKind, PathBuf, Option<PgSettings>), String> {
    let store_name = store_name(c, dir);
    let postgres = if store_name == "postgres" {
        Some(postgres_settings(c)?)
    } else {
        None
    };
    let store: StoreKind = if postgres.is_some() {
        StoreKind::default()
    } else {
        store_name
            .parse()
            .map_err(|e| bad("store", format!("{e} (or \"postgres\")")))?
    };
    let store_path = dir.join(
        c.store_path
            .clone()
            .unwrap_or_else(|| format!("store.{}", store.as_str())),
    );
    Ok((store, store_path, postgres))
}

/// The store named by `store`, or the default. A config without
/// `store` (nor `store_path`) written when an earlier default (redb,
/// then fjall) was in force, whose node directory holds
/// `store.fjall` or `store.redb` and no store of the default keeps the
/// one it has (the newer if both): otherwise the node would start on a
/// new, empty store and leave every pending obligation behind.
fn store_name(c: &NodeConfig, dir: &Path) -> String {
    if let Some(s) = &c.store {
        return s.clone();
    }
    let file = |k: StoreKind| dir.join(format!("store.{}", k.as_str()));
    if c.store_path.is_none() && !file(StoreKind::default()).exists() {
        let earlier = [StoreKind::Fjall, StoreKind::Redb];
        if let Some(legacy) = earlier.into_iter().find(|k| file(*k).exists()) {
            tracing::warn!(
                "config.toml names no store and {} exists: keeping {legacy} (write `store = \"{legacy}\"` to silence this)",
                file(legacy).display()
            );
            return legacy.as_str().into();
        }
    }
    StoreKind::default().as_str().into()
}

/// The `postgres_*` keys, checked (`store = "postgres"`).
fn postgres_settings(c: &NodeConfig) -> Result<PgSettings, String> {
    let url = match &c.postgres_url {
        Some(u) => u.0.clone(),
        None => std::env::var(abhyasa_pg::URL_ENV)
            .ok()
            .filter(|u| !u.is_empty())
            .ok_or_else(|| {
                bad(
                    "postgres_url",
                    format!(
                        "store = \"postgres\" needs postgres_url or the environment variable {}",
                        abhyasa_pg::URL_ENV
                    ),
                )
            })?,
    };
    let lease_ms = c.postgres_lease_ms.unwrap_or(10_000);
    if lease_ms < MIN_PG_LEASE_MS {
        return Err(bad(
            "postgres_lease_ms",
            format!("{lease_ms} is below {MIN_PG_LEASE_MS}"),
        ));
    }
    let lease = Duration::from_millis(lease_ms);
    let mut options = abhyasa_pg::PgOptions::with_lease(lease);
    if let Some(h) = &c.postgres_holder {
        if h.is_empty() {
            return Err(bad("postgres_holder", "must not be empty".into()));
        }
        options.holder = h.clone();
    }
    if c.postgres_standby {
        options.takeover = abhyasa_pg::Takeover::Wait {
            poll: (lease / 10).max(Duration::from_millis(50)),
        };
    }
    Ok(PgSettings { url, options })
}
