//! The relay's durable spool on redb (the embedded default engine).
//!
//! Rules (spec/protocol.md §7):
//! * **Write before receipt.** [`Spool::offer`] commits every frame it
//!   accepts in one redb transaction (one fsync for the batch: group
//!   commit) and only then returns the receipt that says so.
//! * **Dedup.** One copy per frame key (origin, destination, dedup key):
//!   a retransmission with the same inner bytes is accepted without a
//!   write; a different inner under the same key (a newer status query)
//!   replaces the old copy.
//! * **Hold.** A frame is held until min(`expires_at`, arrival +
//!   `max_hold`) and dropped then, counted, never handed out late.
//! * **Leave only on evidence.** A frame leaves on [`Spool::remove`]
//!   (`Delivered`, or a matching sealed ack passing back) or on expiry;
//!   handing it out ([`Spool::pending_for`]) removes nothing, so a crash
//!   after a push loses nothing.
//! * **Quotas** per destination, per origin and in total, answered with
//!   typed refusals and a retry hint.
//!
//! * **Damage is dropped, never delivered.** Every entry carries a CRC-32
//!   of its bytes. At open an entry that does not check or decode is moved,
//!   verbatim, into the `damaged` table in one transaction, counted
//!   (`damaged`), logged with its origin, destination and dedup key where
//!   they can still be read, and listed by [`Spool::damaged`]; the relay
//!   serves everything else. A held frame is not custody (its origin keeps
//!   custody end to end and retries), so a dropped frame is redelivered or
//!   escalated by its custodian. A file the engine cannot open, or a panic
//!   inside the engine, is a typed [`SpoolError`]: the relay does not start.
//!
//! What damage to the synced spool file does (`tests/spool_damage.rs`,
//! C-SD-2 and C-SD-4: 40 frames receipted, one fault, reopened; seed 42,
//! 30 faults over an 86 KiB file):
//!
//! | fault | what open does | what is lost |
//! |---|---|---|
//! | bit flip (16) | intact where redb does not read (9); an entry whose bytes changed is moved aside and reported (5); a damaged page is a typed error (2) | the reported frames (their origins retry or escalate) |
//! | zeroed 512 B / 4 KiB sector (7) | intact (4), reported (1), typed error (2) | the reported frames |
//! | misdirected sector (4) | intact (2), reported (2) | the reported frames |
//! | truncation (3) | typed error: the relay does not start | nothing is delivered from it |
//!
//! Never a panic, never a damaged frame handed out, never a receipted
//! frame missing without being reported.
//!
//! The spool never reads a clock: every call takes `now`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use abhyasa_core::wire::{
    Envelope, FrameKey, Message, Refusal, RefusalCode, RelayMessage, RelayReceipt, Sealed,
};
use abhyasa_core::{AgentId, Timestamp};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use sha2::{Digest as _, Sha256};

const FRAMES: TableDefinition<'static, u64, &'static [u8]> = TableDefinition::new("frames");
const COUNTERS: TableDefinition<'static, &'static str, u64> = TableDefinition::new("counters");
/// Entries found damaged at open, verbatim, by their sequence number.
const DAMAGED: TableDefinition<'static, u64, &'static [u8]> = TableDefinition::new("damaged");

/// The first byte of an entry with a checksum. Entries without one (older
/// spools) start with the high byte of a current Unix time in
/// microseconds, which is 0.
const ENTRY_TAG: u8 = 0xa5;
/// Tag and CRC-32 in front of the entry's times and envelope.
const ENTRY_HEAD: usize = 5;

/// Spool bounds. Every one is a quota a peer cannot push us past.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SpoolLimits {
    /// Longest a frame is held, whatever its `expires_at`.
    pub max_hold: Duration,
    /// Largest sealed frame held, in bytes (`too_large` beyond).
    pub max_frame_bytes: usize,
    /// Most frames queued for one destination (`destination_quota`).
    pub per_destination: usize,
    /// Most frames held from one origin (`origin_quota`).
    pub per_origin: usize,
    /// Most bytes held from one origin (`origin_quota`), so that one
    /// tenant cannot take the whole of `total_bytes` from the others
    /// (C-PA-2). Default 64 MiB, a sixteenth of the default `total_bytes`.
    pub per_origin_bytes: u64,
    /// Most frames held in total (`spool_full`).
    pub total_frames: usize,
    /// Most bytes held in total (`spool_full`).
    pub total_bytes: u64,
    /// The retry hint sent with a quota refusal.
    pub retry_hint: Duration,
}

impl Default for SpoolLimits {
    fn default() -> Self {
        Self {
            max_hold: Duration::from_secs(24 * 3600),
            max_frame_bytes: abhyasa_core::wire::DEFAULT_MAX_FRAME,
            per_destination: 100_000,
            per_origin: 100_000,
            per_origin_bytes: 64 << 20,
            total_frames: 1_000_000,
            total_bytes: 1 << 30,
            retry_hint: Duration::from_secs(30),
        }
    }
}

/// The spool's storage failed; nothing of the failed call was accepted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpoolError {
    /// The engine reported an error.
    #[error("spool {op}: {detail}")]
    Backend {
        /// What was being done.
        op: &'static str,
        /// The engine's message.
        detail: String,
    },
    /// A stored frame does not decode (the file was damaged).
    #[error("spool entry {seq} is damaged: {detail}")]
    Corrupt {
        /// The entry.
        seq: u64,
        /// What is wrong.
        detail: String,
    },
    /// The storage engine panicked on the file (a damaged page it does
    /// not check); nothing was read from it.
    #[error("spool {op}: the storage engine panicked ({detail}); the spool file is damaged")]
    EnginePanicked {
        /// What was being done.
        op: &'static str,
        /// The panic's message.
        detail: String,
    },
}

/// An entry moved aside at open because it did not check or decode
/// ([`Spool::damaged`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedFrame {
    /// Its sequence number in the spool.
    pub seq: u64,
    /// What is wrong with it.
    pub detail: String,
    /// Origin, destination and dedup key as read from the damaged bytes,
    /// when the envelope still decodes (they may be among what changed).
    pub as_read: Option<(AgentId, AgentId, FrameKey)>,
}

fn backend(op: &'static str) -> impl Fn(redb::Error) -> SpoolError {
    move |e| SpoolError::Backend {
        op,
        detail: e.to_string(),
    }
}

fn be<E: Into<redb::Error>>(op: &'static str) -> impl Fn(E) -> SpoolError {
    move |e| backend(op)(e.into())
}

#[derive(Debug, Clone)]
struct Entry {
    seq: u64,
    origin: AgentId,
    destination: AgentId,
    size: usize,
    hold_until: Timestamp,
    received_at: Timestamp,
    inner_hash: [u8; 32],
}

/// What [`Spool::status`] reports per destination.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DestinationStatus {
    /// The destination.
    pub destination: AgentId,
    /// Frames queued for it.
    pub depth: usize,
    /// Their total size in bytes.
    pub bytes: u64,
    /// Age of the oldest queued frame, in seconds (0 when empty).
    pub oldest_age_seconds: u64,
    /// Frames dropped at their hold time, ever.
    pub expired: u64,
    /// Frames refused, ever, by code.
    pub refused: BTreeMap<String, u64>,
}

/// A snapshot of the spool (`abhyasa relay status`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SpoolStatus {
    /// When these counts were taken, Unix seconds.
    pub as_of_unix_seconds: i64,
    /// Frames held.
    pub frames: usize,
    /// Bytes held.
    pub bytes: u64,
    /// Per destination, sorted.
    pub destinations: Vec<DestinationStatus>,
}

/// The durable spool. Single writer: the relay daemon owns it.
pub struct Spool {
    db: redb::Database,
    limits: SpoolLimits,
    next_seq: u64,
    by_key: HashMap<FrameKey, Entry>,
    queues: BTreeMap<AgentId, BTreeMap<u64, FrameKey>>,
    /// Frames and bytes held per origin.
    per_origin: HashMap<AgentId, (usize, u64)>,
    total_bytes: u64,
    counters: BTreeMap<String, u64>,
    dirty_counters: bool,
    damaged: Vec<DamagedFrame>,
}

impl std::fmt::Debug for Spool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spool")
            .field("frames", &self.by_key.len())
            .field("bytes", &self.total_bytes)
            .finish_non_exhaustive()
    }
}

fn encode_entry(hold_until: Timestamp, received_at: Timestamp, sealed: &Sealed) -> Vec<u8> {
    let env = Envelope::new(
        sealed.origin.clone(),
        Message::Relay(RelayMessage::Sealed(Box::new(sealed.clone()))),
    );
    let mut out = Vec::with_capacity(ENTRY_HEAD + 16 + sealed.inner.len() + 512);
    out.push(ENTRY_TAG);
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&hold_until.unix_micros().to_be_bytes());
    out.extend_from_slice(&received_at.unix_micros().to_be_bytes());
    out.extend_from_slice(&env.encode());
    let crc = crc32fast::hash(&out[ENTRY_HEAD..]);
    out[1..ENTRY_HEAD].copy_from_slice(&crc.to_le_bytes());
    out
}

fn decode_entry(seq: u64, b: &[u8]) -> Result<(Timestamp, Timestamp, Sealed), SpoolError> {
    let corrupt = |detail: String| SpoolError::Corrupt { seq, detail };
    let b = match b.first() {
        Some(&ENTRY_TAG) if b.len() >= ENTRY_HEAD => {
            let mut crc = [0u8; 4];
            crc.copy_from_slice(&b[1..ENTRY_HEAD]);
            let body = &b[ENTRY_HEAD..];
            if crc32fast::hash(body) != u32::from_le_bytes(crc) {
                return Err(corrupt("its checksum does not match its bytes".into()));
            }
            body
        }
        // An entry written before checksums.
        Some(0) => b,
        _ => return Err(corrupt("neither a checked nor an older entry".into())),
    };
    if b.len() < 16 {
        return Err(corrupt(format!("{} bytes", b.len())));
    }
    let micros = |r: &[u8]| {
        let mut a = [0u8; 8];
        a.copy_from_slice(r);
        Timestamp::from_unix_micros(i64::from_be_bytes(a))
    };
    let env = Envelope::decode(&b[16..]).map_err(|e| corrupt(e.to_string()))?;
    match env.message {
        Message::Relay(RelayMessage::Sealed(s)) => Ok((micros(&b[..8]), micros(&b[8..16]), *s)),
        other => Err(corrupt(format!("not a sealed frame: {other:?}"))),
    }
}

/// Creates `path` owner-only if it is missing, and makes it owner-only if
/// it is not.
#[cfg(unix)]
fn owner_only(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        }
        Err(e) => Err(e),
    }
}

#[cfg(not(unix))]
fn owner_only(_path: &Path) -> std::io::Result<()> {
    Ok(())
}

/// Origin, destination and dedup key of a damaged entry whose envelope
/// still decodes (skipping the checksum).
fn as_read(b: &[u8]) -> Option<(AgentId, AgentId, FrameKey)> {
    let body = match b.first() {
        Some(&ENTRY_TAG) => b.get(ENTRY_HEAD..)?,
        _ => b,
    };
    let env = Envelope::decode(body.get(16..)?).ok()?;
    match env.message {
        Message::Relay(RelayMessage::Sealed(s)) => {
            Some((s.origin.clone(), s.destination.clone(), s.key()))
        }
        _ => None,
    }
}

/// Tells a retransmission (same inner bytes) from a replacement under the
/// same key.
fn inner_hash(inner: &[u8]) -> [u8; 32] {
    Sha256::digest(inner).into()
}

impl Spool {
    /// Opens (or creates) the spool file and loads its index: everything
    /// receipted before a crash is there again.
    ///
    /// The file is made owner-only (0600): the frames in it are signed
    /// but not encrypted (spec/protocol.md §7, C-PA-3). An entry that does
    /// not check or decode is moved aside, counted and logged
    /// ([`Spool::damaged`]); a file the engine cannot read is an error, as
    /// is a panic inside the engine (caught here).
    pub fn open(path: &Path, limits: SpoolLimits) -> Result<Self, SpoolError> {
        owner_only(path).map_err(|e| SpoolError::Backend {
            op: "set the file owner-only",
            detail: e.to_string(),
        })?;
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Self::open_inner(path, limits)
        }))
        .unwrap_or_else(|p| {
            let detail = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "no message".into());
            Err(SpoolError::EnginePanicked { op: "open", detail })
        })
    }

    fn open_inner(path: &Path, limits: SpoolLimits) -> Result<Self, SpoolError> {
        let db = redb::Database::create(path).map_err(be("open"))?;
        let w = db.begin_write().map_err(be("begin write"))?;
        {
            w.open_table(FRAMES).map_err(be("open table"))?;
            w.open_table(COUNTERS).map_err(be("open table"))?;
            w.open_table(DAMAGED).map_err(be("open table"))?;
        }
        w.commit().map_err(be("commit"))?;
        let mut spool = Self {
            db,
            limits,
            next_seq: 1,
            by_key: HashMap::new(),
            queues: BTreeMap::new(),
            per_origin: HashMap::new(),
            total_bytes: 0,
            counters: BTreeMap::new(),
            dirty_counters: false,
            damaged: Vec::new(),
        };
        let r = spool.db.begin_read().map_err(be("begin read"))?;
        let frames = r.open_table(FRAMES).map_err(be("open table"))?;
        let mut bad: Vec<(u64, Vec<u8>)> = Vec::new();
        for item in frames.iter().map_err(be("scan"))? {
            let (k, v) = item.map_err(be("scan"))?;
            let seq = k.value();
            spool.next_seq = spool.next_seq.max(seq.saturating_add(1));
            match decode_entry(seq, v.value()) {
                Ok((hold_until, received_at, sealed)) => {
                    spool.index(seq, &sealed, v.value().len(), hold_until, received_at)
                }
                Err(SpoolError::Corrupt { detail, .. }) => {
                    spool.damaged.push(DamagedFrame {
                        seq,
                        detail,
                        as_read: as_read(v.value()),
                    });
                    bad.push((seq, v.value().to_vec()));
                }
                Err(e) => return Err(e),
            }
        }
        let counters = r.open_table(COUNTERS).map_err(be("open table"))?;
        for item in counters.iter().map_err(be("scan"))? {
            let (k, v) = item.map_err(be("scan"))?;
            spool.counters.insert(k.value().to_string(), v.value());
        }
        drop((frames, counters, r));
        if !bad.is_empty() {
            spool.set_aside(&bad)?;
        }
        Ok(spool)
    }

    /// Moves damaged entries into the `damaged` table, verbatim, and
    /// counts them, in one transaction; logs each.
    fn set_aside(&mut self, bad: &[(u64, Vec<u8>)]) -> Result<(), SpoolError> {
        for d in &self.damaged {
            match &d.as_read {
                Some((origin, destination, key)) => tracing::warn!(
                    seq = d.seq, %origin, %destination, %key, detail = %d.detail,
                    "spooled frame damaged on disk: dropped, not delivered"
                ),
                None => tracing::warn!(
                    seq = d.seq, detail = %d.detail,
                    "spooled frame damaged on disk beyond reading: dropped, not delivered"
                ),
            }
        }
        let n = u64::try_from(bad.len()).unwrap_or(u64::MAX);
        *self.counters.entry("damaged".into()).or_default() += n;
        self.dirty_counters = true;
        let w = self.db.begin_write().map_err(be("begin write"))?;
        {
            let mut frames = w.open_table(FRAMES).map_err(be("open table"))?;
            let mut aside = w.open_table(DAMAGED).map_err(be("open table"))?;
            for (seq, bytes) in bad {
                aside.insert(*seq, bytes.as_slice()).map_err(be("insert"))?;
                frames.remove(*seq).map_err(be("remove"))?;
            }
            self.write_counters(&w)?;
        }
        w.commit().map_err(be("commit"))?;
        self.dirty_counters = false;
        Ok(())
    }

    /// The entries this open found damaged and moved aside (not
    /// delivered); the `damaged` counter holds how many ever were.
    pub fn damaged(&self) -> &[DamagedFrame] {
        &self.damaged
    }

    /// Frames found damaged at any open, ever.
    pub fn damaged_total(&self) -> u64 {
        self.counters.get("damaged").copied().unwrap_or(0)
    }

    fn index(
        &mut self,
        seq: u64,
        sealed: &Sealed,
        size: usize,
        hold_until: Timestamp,
        received_at: Timestamp,
    ) {
        let key = sealed.key();
        self.queues
            .entry(sealed.destination.clone())
            .or_default()
            .insert(seq, key);
        let o = self.per_origin.entry(sealed.origin.clone()).or_default();
        o.0 += 1;
        o.1 += size as u64;
        self.total_bytes += size as u64;
        self.by_key.insert(
            key,
            Entry {
                seq,
                origin: sealed.origin.clone(),
                destination: sealed.destination.clone(),
                size,
                hold_until,
                received_at,
                inner_hash: inner_hash(&sealed.inner),
            },
        );
    }

    fn unindex(&mut self, key: &FrameKey) -> Option<Entry> {
        let e = self.by_key.remove(key)?;
        if let Some(q) = self.queues.get_mut(&e.destination) {
            q.remove(&e.seq);
            if q.is_empty() {
                self.queues.remove(&e.destination);
            }
        }
        if let Some(o) = self.per_origin.get_mut(&e.origin) {
            o.0 -= 1;
            o.1 -= e.size as u64;
            if o.0 == 0 {
                self.per_origin.remove(&e.origin);
            }
        }
        self.total_bytes -= e.size as u64;
        Some(e)
    }

    fn count(&mut self, name: String) {
        *self.counters.entry(name).or_default() += 1;
        self.dirty_counters = true;
    }

    /// The limits in force.
    pub fn limits(&self) -> &SpoolLimits {
        &self.limits
    }

    /// Frames held.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Whether frame `key` is held.
    pub fn contains(&self, key: &FrameKey) -> bool {
        self.by_key.contains_key(key)
    }

    /// The destination of held frame `key`.
    pub fn destination_of(&self, key: &FrameKey) -> Option<&AgentId> {
        self.by_key.get(key).map(|e| &e.destination)
    }

    /// Frames queued for `destination`.
    pub fn depth(&self, destination: &AgentId) -> usize {
        self.queues.get(destination).map_or(0, BTreeMap::len)
    }

    /// Takes sealed frames that arrived from `hop` and answers with the
    /// receipt. Accepted frames are durable when this returns (one commit
    /// for the batch). `serves(destination)` says whether the relay serves
    /// a destination. On a storage error nothing is accepted and the caller
    /// sends no receipt: the origin's custody retries.
    pub fn offer(
        &mut self,
        now: Timestamp,
        hop: &AgentId,
        frames: Vec<Sealed>,
        serves: impl Fn(&AgentId) -> bool,
    ) -> Result<RelayReceipt, SpoolError> {
        let mut receipt = RelayReceipt::default();
        let hint = u32::try_from(self.limits.retry_hint.as_secs()).unwrap_or(u32::MAX);
        // Decided in memory first (counts include this batch), written in
        // one transaction, indexed only after the commit.
        let mut writes: Vec<(FrameKey, u64, Vec<u8>, Sealed, Timestamp)> = Vec::new();
        let mut replaced: Vec<FrameKey> = Vec::new();
        let mut dest_add: HashMap<AgentId, usize> = HashMap::new();
        let mut origin_add: HashMap<AgentId, usize> = HashMap::new();
        let mut origin_bytes_add: HashMap<AgentId, u64> = HashMap::new();
        let mut frames_add = 0usize;
        let mut bytes_add = 0u64;
        let mut batch_keys: HashSet<FrameKey> = HashSet::new();
        let max_hold_until = now.saturating_add(self.limits.max_hold);
        for sealed in frames {
            let key = sealed.key();
            let refuse = |code| Refusal {
                key,
                code,
                retry_after_seconds: match code {
                    RefusalCode::DestinationQuota
                    | RefusalCode::OriginQuota
                    | RefusalCode::SpoolFull => hint,
                    _ => 0,
                },
            };
            let hold_until = sealed.expires_at.min(max_hold_until);
            let entry = encode_entry(hold_until, now, &sealed);
            let code = if &sealed.origin != hop {
                // Only the origin may spool its frames: a peer cannot fill
                // the spool in another's name.
                Some(RefusalCode::Unauthorized)
            } else if !serves(&sealed.destination) {
                Some(RefusalCode::UnknownDestination)
            } else if sealed.expires_at <= now {
                Some(RefusalCode::Expired)
            } else if entry.len() > self.limits.max_frame_bytes {
                Some(RefusalCode::TooLarge)
            } else {
                None
            };
            if let Some(code) = code {
                // A destination we do not serve, or a frame in another's
                // name, is counted against the (pinned) hop, so a peer
                // cannot grow the counters with invented names.
                let against = match code {
                    RefusalCode::Unauthorized | RefusalCode::UnknownDestination => hop,
                    _ => &sealed.destination,
                };
                self.count(format!("refused/{}/{against}", code.as_str()));
                receipt.refused.push(refuse(code));
                continue;
            }
            let existing = self.by_key.get(&key);
            if batch_keys.contains(&key)
                || existing.is_some_and(|e| e.inner_hash == inner_hash(&sealed.inner))
            {
                // A retransmission: already durable (or in this batch).
                receipt.accepted.push(key);
                continue;
            }
            let is_new = existing.is_none();
            // C-PA-2: an origin's bytes, this batch's included (a
            // replacement counted in full: conservative, never over).
            let orig_bytes = self.per_origin.get(&sealed.origin).map_or(0, |o| o.1)
                + origin_bytes_add.get(&sealed.origin).copied().unwrap_or(0)
                + entry.len() as u64;
            if orig_bytes > self.limits.per_origin_bytes {
                self.count(format!(
                    "refused/{}/{}",
                    RefusalCode::OriginQuota.as_str(),
                    sealed.destination
                ));
                receipt.refused.push(refuse(RefusalCode::OriginQuota));
                continue;
            }
            if is_new {
                let dest = self.depth(&sealed.destination)
                    + dest_add.get(&sealed.destination).copied().unwrap_or(0);
                let orig = self.per_origin.get(&sealed.origin).map_or(0, |o| o.0)
                    + origin_add.get(&sealed.origin).copied().unwrap_or(0);
                let code = if dest >= self.limits.per_destination {
                    Some(RefusalCode::DestinationQuota)
                } else if orig >= self.limits.per_origin {
                    Some(RefusalCode::OriginQuota)
                } else if self.by_key.len() + frames_add >= self.limits.total_frames
                    || self.total_bytes + bytes_add + entry.len() as u64 > self.limits.total_bytes
                {
                    Some(RefusalCode::SpoolFull)
                } else {
                    None
                };
                if let Some(code) = code {
                    self.count(format!("refused/{}/{}", code.as_str(), sealed.destination));
                    receipt.refused.push(refuse(code));
                    continue;
                }
                *dest_add.entry(sealed.destination.clone()).or_default() += 1;
                *origin_add.entry(sealed.origin.clone()).or_default() += 1;
                frames_add += 1;
            } else {
                replaced.push(key);
            }
            bytes_add += entry.len() as u64;
            *origin_bytes_add.entry(sealed.origin.clone()).or_default() += entry.len() as u64;
            batch_keys.insert(key);
            let seq = self.next_seq + writes.len() as u64;
            writes.push((key, seq, entry, sealed, hold_until));
            receipt.accepted.push(key);
        }
        if !writes.is_empty() || self.dirty_counters {
            let w = self.db.begin_write().map_err(be("begin write"))?;
            {
                let mut t = w.open_table(FRAMES).map_err(be("open table"))?;
                for key in &replaced {
                    if let Some(e) = self.by_key.get(key) {
                        t.remove(e.seq).map_err(be("remove"))?;
                    }
                }
                for (_, seq, entry, _, _) in &writes {
                    t.insert(*seq, entry.as_slice()).map_err(be("insert"))?;
                }
                self.write_counters(&w)?;
            }
            w.commit().map_err(be("commit"))?;
            self.dirty_counters = false;
        }
        self.next_seq += writes.len() as u64;
        for key in &replaced {
            self.unindex(key);
        }
        for (_, seq, entry, sealed, hold_until) in writes {
            self.index(seq, &sealed, entry.len(), hold_until, now);
        }
        Ok(receipt)
    }

    fn write_counters(&self, w: &redb::WriteTransaction) -> Result<(), SpoolError> {
        if !self.dirty_counters {
            return Ok(());
        }
        let mut c = w.open_table(COUNTERS).map_err(be("open table"))?;
        for (k, v) in &self.counters {
            c.insert(k.as_str(), *v).map_err(be("insert"))?;
        }
        Ok(())
    }

    /// Up to `max_frames` frames (and `max_bytes` bytes, but always at
    /// least one if any) queued for `destination`, oldest first, skipping
    /// `skip` (frames already pushed on this connection) and frames past
    /// their hold time. Removes nothing. Also returns how many queued
    /// frames are left beyond those returned.
    pub fn pending_for(
        &self,
        now: Timestamp,
        destination: &AgentId,
        max_frames: usize,
        max_bytes: u64,
        skip: &HashSet<FrameKey>,
    ) -> Result<(Vec<Sealed>, u64), SpoolError> {
        let Some(q) = self.queues.get(destination) else {
            return Ok((Vec::new(), 0));
        };
        let r = self.db.begin_read().map_err(be("begin read"))?;
        let t = r.open_table(FRAMES).map_err(be("open table"))?;
        let mut out = Vec::new();
        let mut bytes = 0u64;
        let mut eligible = 0u64;
        // In order: once the budget is spent, later (smaller) frames wait
        // too. The first frame always goes, so a budget below one frame
        // still makes progress.
        let mut full = false;
        for (seq, key) in q {
            let Some(e) = self.by_key.get(key) else {
                continue;
            };
            if skip.contains(key) || e.hold_until <= now {
                continue;
            }
            eligible += 1;
            let size = e.size as u64;
            if full || out.len() >= max_frames || (!out.is_empty() && bytes + size > max_bytes) {
                full = true;
                continue;
            }
            let v = t
                .get(*seq)
                .map_err(be("read"))?
                .ok_or_else(|| SpoolError::Corrupt {
                    seq: *seq,
                    detail: "indexed but absent".into(),
                })?;
            let (_, _, sealed) = decode_entry(*seq, v.value())?;
            bytes += size;
            out.push(sealed);
        }
        let remaining = eligible - out.len() as u64;
        Ok((out, remaining))
    }

    /// Drops frames for good (`Delivered`, or a matching ack passed back),
    /// durably. Unknown keys are ignored. Returns how many were dropped.
    pub fn remove(&mut self, keys: &[FrameKey]) -> Result<usize, SpoolError> {
        let held: Vec<FrameKey> = keys
            .iter()
            .filter(|k| self.by_key.contains_key(k))
            .copied()
            .collect();
        if held.is_empty() {
            return Ok(0);
        }
        let w = self.db.begin_write().map_err(be("begin write"))?;
        {
            let mut t = w.open_table(FRAMES).map_err(be("open table"))?;
            for k in &held {
                if let Some(e) = self.by_key.get(k) {
                    t.remove(e.seq).map_err(be("remove"))?;
                }
            }
            self.write_counters(&w)?;
        }
        w.commit().map_err(be("commit"))?;
        self.dirty_counters = false;
        let mut n = 0;
        for k in &held {
            if self.unindex(k).is_some() {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Drops every frame whose hold time has come, counting each against
    /// its destination. Returns the keys dropped.
    pub fn expire(&mut self, now: Timestamp) -> Result<Vec<FrameKey>, SpoolError> {
        let due: Vec<(FrameKey, AgentId)> = self
            .by_key
            .iter()
            .filter(|(_, e)| e.hold_until <= now)
            .map(|(k, e)| (*k, e.destination.clone()))
            .collect();
        if due.is_empty() {
            return Ok(Vec::new());
        }
        for (_, d) in &due {
            self.count(format!("expired/{d}"));
        }
        let keys: Vec<FrameKey> = due.iter().map(|(k, _)| *k).collect();
        self.remove(&keys)?;
        for (k, d) in &due {
            tracing::info!(key = %k, destination = %d, "spooled frame expired undelivered");
        }
        Ok(keys)
    }

    /// The earliest hold time among held frames (when to call
    /// [`expire`](Self::expire) next).
    pub fn next_expiry(&self) -> Option<Timestamp> {
        self.by_key.values().map(|e| e.hold_until).min()
    }

    /// Counts per destination (queue depth, bytes, oldest age, expired and
    /// refused counts).
    pub fn status(&self, now: Timestamp) -> SpoolStatus {
        let mut dests: BTreeMap<AgentId, DestinationStatus> = BTreeMap::new();
        let blank = |d: &AgentId| DestinationStatus {
            destination: d.clone(),
            depth: 0,
            bytes: 0,
            oldest_age_seconds: 0,
            expired: 0,
            refused: BTreeMap::new(),
        };
        for (d, q) in &self.queues {
            let s = dests.entry(d.clone()).or_insert_with(|| blank(d));
            s.depth = q.len();
            for key in q.values() {
                if let Some(e) = self.by_key.get(key) {
                    s.bytes += e.size as u64;
                    let age = now.saturating_duration_since(e.received_at).as_secs();
                    s.oldest_age_seconds = s.oldest_age_seconds.max(age);
                }
            }
        }
        for (name, n) in &self.counters {
            if let Some(d) = name.strip_prefix("expired/") {
                if let Ok(d) = AgentId::new(d) {
                    dests.entry(d.clone()).or_insert_with(|| blank(&d)).expired = *n;
                }
            } else if let Some((code, d)) = name
                .strip_prefix("refused/")
                .and_then(|rest| rest.split_once('/'))
            {
                if let Ok(d) = AgentId::new(d) {
                    dests
                        .entry(d.clone())
                        .or_insert_with(|| blank(&d))
                        .refused
                        .insert(code.to_string(), *n);
                }
            }
        }
        SpoolStatus {
            as_of_unix_seconds: now.unix_micros().div_euclid(1_000_000),
            frames: self.by_key.len(),
            bytes: self.total_bytes,
            destinations: dests.into_values().collect(),
        }
    }
}
