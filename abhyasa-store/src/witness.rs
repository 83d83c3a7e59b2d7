//! Row witnesses: for each table that holds custody, the number of its
//! rows and an order-independent digest of them (the XOR of one 64-bit
//! hash per row, of its key and value; of its key alone for
//! `custody_pending`, whose rows end in a CRC of their own and are
//! deleted without being read), kept in `meta` and moved in the same
//! transaction as every row written or deleted
//! ([`crate::index::Indexed`]).
//!
//! A storage engine's own checksums catch bytes that change inside what
//! it reads; they cannot tell that a row it no longer finds was ever
//! there (a page that reads as an older, valid one; a tree that lost a
//! leaf), and a server-backed store has no checksum of ours at all.
//! [`crate::engine::load`] hashes every row it reads and compares the
//! result with the witness: a row gone missing, altered, or added behind
//! the store's back is [`StoreError::Corrupt`] naming the table, so the
//! node refuses to start rather than run without custody it acknowledged
//! or on a ledger entry that no longer says what was applied. The cost
//! per commit is one `meta` read and write per witnessed table it writes.

use abhyasa_core::store::StoreError;

use crate::codec::corrupt;
use crate::engine::{Table, Txn, View};

/// The tables whose rows are witnessed: every table whose loss would drop
/// custody (pending rows and the principal withholds opened with them),
/// a finished transfer (terminal summaries, escalations, late acks) or a
/// receiver's proof of application (ledger entries, intents, the effects
/// and key sequences applied with them).
pub(crate) const WITNESSED: [Table; 9] = [
    Table::Pending,
    Table::Terminal,
    Table::Escalations,
    Table::Reconciliations,
    Table::Principal,
    Table::Ledger,
    Table::KeySequences,
    Table::Effects,
    Table::Intents,
];

/// The printable key a witness mismatch is reported under.
pub(crate) const WITNESS_LABEL: &str = "(row witness)";

/// Whether rows of `t` are witnessed.
pub(crate) fn witnessed(t: Table) -> bool {
    WITNESSED.contains(&t)
}

/// The `meta` key of the witness of table `t`.
pub(crate) fn meta_key(t: Table) -> Vec<u8> {
    let mut k = b"witness.".to_vec();
    k.extend_from_slice(t.name().as_bytes());
    k
}

/// The hash of row `k` (value `v`) of table `t`: FNV-1a over the table,
/// the key's length, the key and the value (the key alone for
/// `custody_pending`), then a 64-bit finalizer so that rows differing in
/// one bit differ in about half the bits (the digest is their XOR).
/// Fixed forever: it is stored.
fn row_hash(t: Table, k: &[u8], v: &[u8]) -> u64 {
    let v = if t == Table::Pending { &[][..] } else { v };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let head = (t.index() as u8, (k.len() as u32).to_le_bytes());
    for b in std::iter::once(head.0)
        .chain(head.1)
        .chain(k.iter().copied())
        .chain(v.iter().copied())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The rows of one table as a count and a digest of their keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Witness {
    rows: u64,
    digest: u64,
}

impl Witness {
    /// Counts row `k` (value `v`) of `t`.
    pub(crate) fn add(&mut self, t: Table, k: &[u8], v: &[u8]) {
        self.rows = self.rows.wrapping_add(1);
        self.digest ^= row_hash(t, k, v);
    }

    /// The rows counted.
    pub(crate) fn rows(self) -> u64 {
        self.rows
    }

    fn encode(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.rows.to_be_bytes());
        b[8..].copy_from_slice(&self.digest.to_be_bytes());
        b
    }

    fn decode(t: Table, b: &[u8]) -> Result<Self, StoreError> {
        let b: [u8; 16] = b
            .try_into()
            .map_err(|_| corrupt("meta", &meta_key(t), "a row witness is not 16 bytes"))?;
        let (rows, digest) = b.split_at(8);
        Ok(Self {
            rows: u64::from_be_bytes(rows.try_into().unwrap_or_default()),
            digest: u64::from_be_bytes(digest.try_into().unwrap_or_default()),
        })
    }
}

/// The stored witness of `t`, `None` when there is none.
pub(crate) fn read(v: &dyn View, t: Table) -> Result<Option<Witness>, StoreError> {
    v.get(Table::Meta, &meta_key(t))?
        .map(|b| Witness::decode(t, &b))
        .transpose()
}

/// Why the rows of `t` read as `found` do not match the witness `stored`
/// (`None`: they match).
pub(crate) fn mismatch(t: Table, stored: Option<Witness>, found: Witness) -> Option<String> {
    match stored {
        None => Some(format!(
            "its row witness is missing from meta: whether rows of {} are gone cannot be \
             told ({} rows read)",
            t.name(),
            found.rows
        )),
        Some(w) if w == found => None,
        Some(w) if w.rows > found.rows => Some(format!(
            "{} rows were written and {} are there: {} rows are missing (key digest \
             {:016x}, expected {:016x})",
            w.rows,
            found.rows,
            w.rows - found.rows,
            found.digest,
            w.digest
        )),
        Some(w) => Some(format!(
            "{} rows were written and {} are there, with another key digest ({:016x}, \
             expected {:016x}): rows are missing, altered or were added behind the store's back",
            w.rows, found.rows, found.digest, w.digest
        )),
    }
}

/// Checks rows read as `found` against the stored witness of `t`.
pub(crate) fn verify(v: &dyn View, t: Table, found: Witness) -> Result<(), StoreError> {
    match mismatch(t, read(v, t)?, found) {
        None => Ok(()),
        Some(detail) => Err(StoreError::Corrupt {
            table: t.name(),
            key: WITNESS_LABEL.to_string(),
            detail,
        }),
    }
}

/// Writes `w` as the witness of `t` (a new database, a rebuild).
pub(crate) fn write(txn: &mut dyn Txn, t: Table, w: Witness) -> Result<(), StoreError> {
    txn.put(Table::Meta, &meta_key(t), &w.encode())
}

/// How one transaction moves the witnesses.
#[derive(Debug, Default)]
pub(crate) struct Moves {
    rows: [i64; Table::ALL.len()],
    digest: [u64; Table::ALL.len()],
}

impl Moves {
    /// Row `k` of `t` held `before` and holds `after` (`None`: absent).
    /// A pending row's value is not hashed: pass any bytes for it.
    pub(crate) fn row(&mut self, t: Table, k: &[u8], before: Option<&[u8]>, after: Option<&[u8]>) {
        if !witnessed(t) {
            return;
        }
        let i = t.index();
        if let Some(v) = before {
            self.rows[i] -= 1;
            self.digest[i] ^= row_hash(t, k, v);
        }
        if let Some(v) = after {
            self.rows[i] += 1;
            self.digest[i] ^= row_hash(t, k, v);
        }
    }

    /// Writes the witnesses this transaction moved.
    pub(crate) fn finish(&self, txn: &mut dyn Txn) -> Result<(), StoreError> {
        for t in WITNESSED {
            let i = t.index();
            if self.rows[i] == 0 && self.digest[i] == 0 {
                continue;
            }
            let k = meta_key(t);
            let Some(b) = txn.get(Table::Meta, &k)? else {
                return Err(corrupt(
                    "meta",
                    &k,
                    "the row witness is missing: the store cannot vouch for its rows",
                ));
            };
            let mut w = Witness::decode(t, &b)?;
            w.rows = w.rows.checked_add_signed(self.rows[i]).ok_or_else(|| {
                corrupt(
                    "meta",
                    &k,
                    format!(
                        "{} rows moved by {} leave the u64 range",
                        w.rows, self.rows[i]
                    ),
                )
            })?;
            w.digest ^= self.digest[i];
            write(txn, t, w)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_does_not_depend_on_order_and_sees_one_key_changed() {
        let keys: Vec<Vec<u8>> = (0..100u32)
            .map(|i| format!("ob-{i}").into_bytes())
            .collect();
        let mut a = Witness::default();
        let mut b = Witness::default();
        for k in &keys {
            a.add(Table::Ledger, k, b"applied");
        }
        for k in keys.iter().rev() {
            b.add(Table::Ledger, k, b"applied");
        }
        assert_eq!(a, b);
        let mut c = Witness::default();
        let mut d = Witness::default();
        for (i, k) in keys.iter().enumerate() {
            c.add(
                Table::Ledger,
                if i == 50 { b"ob-50x" } else { k },
                b"applied",
            );
            d.add(
                Table::Ledger,
                k,
                if i == 50 { b"applieD" } else { b"applied" },
            );
        }
        assert_eq!(c.rows, a.rows);
        assert_ne!(c.digest, a.digest);
        assert_ne!(d.digest, a.digest, "a changed value is seen");
        // A pending row's value is not hashed; the same key in another
        // table hashes apart.
        assert_eq!(
            row_hash(Table::Pending, b"x", b"1"),
            row_hash(Table::Pending, b"x", b"2")
        );
        assert_ne!(
            row_hash(Table::Pending, b"x", b""),
            row_hash(Table::Terminal, b"x", b"")
        );
        // Moves of a transaction: an update moves the digest, not the count.
        let mut m = Moves::default();
        m.row(Table::Ledger, b"k", Some(b"deferred"), Some(b"applied"));
        let i = Table::Ledger.index();
        assert_eq!(m.rows[i], 0);
        assert_eq!(
            m.digest[i],
            row_hash(Table::Ledger, b"k", b"deferred") ^ row_hash(Table::Ledger, b"k", b"applied")
        );
        let back = Witness::decode(Table::Pending, &a.encode()).unwrap();
        assert_eq!(back, a);
    }
}
