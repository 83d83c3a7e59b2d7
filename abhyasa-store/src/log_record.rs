//! The log store's file format (version 2): a log's header, its records,
//! the fill its room is grown with, and the rule that tells a torn final
//! write from damage (C-SD-1, C-SD-2). See `README.md`, "Damage", for the
//! rule in prose.
//!
//! A log file is
//!
//! ```text
//! slot 0 (32 bytes) | slot 1 (32 bytes) | record | record | ... | fill
//! slot:   "ABHYLOG2" | gen u64 | room u64 | followed u32 | crc u32
//! record: len u32 | pcrc u32 | hcrc u32 | payload (len bytes) | mark (4 bytes)
//! ```
//!
//! - **Header slots** witness the log's synced length (`room`) and whether
//!   a later log was started (`followed`). They are written alternately,
//!   each after the bytes it witnesses are synced (the new length with the
//!   next commit, under its sync), so one whole slot always holds what was
//!   true; the newer whole one is in force. A file shorter
//!   than its witnessed room was truncated; a newest log that says a later
//!   one was started lost its successor.
//! - **Records** carry a header checksum (`hcrc`, over the generation, the
//!   offset, `len` and `pcrc`) and a payload checksum (`pcrc`, over the
//!   generation, the offset and the payload), so a record copied to
//!   another offset or log never checks, and a record whose header checks
//!   has a known extent even when its payload does not.
//! - **Fill.** A log is grown with bytes that are a function of the
//!   generation and the offset, every one odd: never zero, never the same
//!   at another offset. A byte still holding its fill was never written
//!   over. A record ends in a mark whose every byte is the complement of
//!   the fill there, so a record's last bytes tell written from not.
//!
//! **The rule.** After the last record that checks, everything up to the
//! end of the file must be fill (or zeros past the witnessed room: growth
//! whose sync never returned). Otherwise the bytes there are one of:
//! a torn final write — nothing that checks follows, nothing but room
//! follows its extent, and some of its bytes provably never landed (a run
//! of 8 fill bytes inside it, its last byte fill, a header field still
//! all fill, or a header whose last byte is fill with nothing written
//! after it) — which was never acknowledged and is dropped; or damage,
//! which refuses the open. Zeros, flipped bits, and sectors copied from elsewhere
//! are never fill, so damage to the last acknowledged record is never read
//! as a tear.

use crate::engine::Table;

/// The magic of a version-2 log's header slots.
pub(crate) const LOG_MAGIC: &[u8; 8] = b"ABHYLOG2";
/// One header slot.
const SLOT: usize = 32;
/// The header of a version-2 log: two slots. Records start here.
pub(crate) const LOG_HEADER: usize = 2 * SLOT;
/// A version-2 record's header: length, payload checksum, header checksum.
pub(crate) const HEADER: usize = 12;
/// A version-2 record's trailing mark.
pub(crate) const MARK: usize = 4;
/// A version-1 record's header: length and checksum.
pub(crate) const HEADER_V1: usize = 8;
/// No commit writes more than this in one record; a longer length in a
/// header is a torn or damaged one.
pub(crate) const MAX_RECORD: usize = 1 << 30;
/// The shortest run of fill bytes inside a record that proves part of it
/// never landed: 8 odd bytes matching their offsets by chance is 2^-56.
const FILL_RUN: usize = 8;

/// A log's header, as one slot holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LogHeader {
    pub(crate) gen: u64,
    /// The log's synced length, as last grown.
    pub(crate) room: u64,
    /// A later log was started after this one.
    pub(crate) followed: bool,
}

impl LogHeader {
    /// The slot's bytes.
    pub(crate) fn encode(&self) -> [u8; SLOT] {
        let mut s = [0u8; SLOT];
        s[..8].copy_from_slice(LOG_MAGIC);
        s[8..16].copy_from_slice(&self.gen.to_le_bytes());
        s[16..24].copy_from_slice(&self.room.to_le_bytes());
        s[24..28].copy_from_slice(&u32::from(self.followed).to_le_bytes());
        let sum = crc(&[&s[..28]]);
        s[28..].copy_from_slice(&sum.to_le_bytes());
        s
    }

    fn decode(s: &[u8]) -> Option<Self> {
        if s.len() < SLOT || &s[..8] != LOG_MAGIC || crc(&[&s[..28]]) != u32_at(s, 28)? {
            return None;
        }
        let followed = match u32_at(s, 24)? {
            0 => false,
            1 => true,
            _ => return None,
        };
        Some(Self {
            gen: u64_at(s, 8)?,
            room: u64_at(s, 16)?,
            followed,
        })
    }

    /// Where slot `i` is.
    pub(crate) fn slot_offset(i: usize) -> u64 {
        (i % 2 * SLOT) as u64
    }
}

/// Whether `b` starts as a version-2 log (either slot's magic): a
/// version-1 log starts with a record's length, and no length that large
/// is written.
pub(crate) fn is_v2(b: &[u8]) -> bool {
    b.get(..8) == Some(LOG_MAGIC.as_slice()) || b.get(SLOT..SLOT + 8) == Some(LOG_MAGIC.as_slice())
}

/// The header in force of a version-2 log (the newer whole slot) and its
/// slot index, or `None` if neither slot checks.
pub(crate) fn log_header(b: &[u8]) -> Option<(LogHeader, usize)> {
    let slots = [0, 1].map(|i| b.get(i * SLOT..(i + 1) * SLOT).and_then(LogHeader::decode));
    match slots {
        [Some(a), Some(c)] => Some(if (c.followed, c.room) > (a.followed, a.room) {
            (c, 1)
        } else {
            (a, 0)
        }),
        [Some(a), None] => Some((a, 0)),
        [None, Some(c)] => Some((c, 1)),
        [None, None] => None,
    }
}

pub(crate) fn crc(parts: &[&[u8]]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for p in parts {
        h.update(p);
    }
    h.finalize()
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    let s = b.get(at..at.checked_add(8)?)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Some(u64::from_le_bytes(a))
}

/// The fill of log `gen` for the 8 bytes from `8 * word`: a mix of both
/// (splitmix64), every byte odd.
fn fill_word(gen: u64, word: u64) -> u64 {
    let mut z = gen
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(word)
        .wrapping_add(0x6A09_E667_F3BC_C909);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) | 0x0101_0101_0101_0101
}

/// The fill byte of log `gen` at offset `at`.
pub(crate) fn fill_byte(gen: u64, at: u64) -> u8 {
    fill_word(gen, at / 8).to_le_bytes()[(at % 8) as usize]
}

/// Writes log `gen`'s fill for the bytes from offset `at` into `out`.
pub(crate) fn fill(gen: u64, at: u64, out: &mut [u8]) {
    let mut i = 0;
    while i < out.len() {
        let x = at + i as u64;
        let w = fill_word(gen, x / 8).to_le_bytes();
        let from = (x % 8) as usize;
        let n = (8 - from).min(out.len() - i);
        out[i..i + n].copy_from_slice(&w[from..from + n]);
        i += n;
    }
}

/// A record's mark, ending at offset `end` of log `gen`: the complement
/// of the fill there.
fn mark(gen: u64, end: u64) -> [u8; MARK] {
    let mut m = [0u8; MARK];
    fill(gen, end - MARK as u64, &mut m);
    m.map(|x| !x)
}

fn header_crc(gen: u64, at: u64, len: u32, pcrc: u32) -> u32 {
    crc(&[
        &gen.to_le_bytes(),
        &at.to_le_bytes(),
        &len.to_le_bytes(),
        &pcrc.to_le_bytes(),
    ])
}

fn payload_crc(gen: u64, at: u64, payload: &[u8]) -> u32 {
    crc(&[&gen.to_le_bytes(), &at.to_le_bytes(), payload])
}

/// Fills in the header of `rec` (a [`HEADER`]'s room, then the payload)
/// and appends its mark, for a record at offset `at` of log `gen`.
/// `Err` with the payload's length if it is longer than a record may be.
pub(crate) fn seal(rec: &mut Vec<u8>, gen: u64, at: u64) -> Result<(), usize> {
    let len = rec.len() - HEADER;
    let len32 = u32::try_from(len)
        .ok()
        .filter(|_| len <= MAX_RECORD)
        .ok_or(len)?;
    let pcrc = payload_crc(gen, at, &rec[HEADER..]);
    let hcrc = header_crc(gen, at, len32, pcrc);
    rec[..4].copy_from_slice(&len32.to_le_bytes());
    rec[4..8].copy_from_slice(&pcrc.to_le_bytes());
    rec[8..HEADER].copy_from_slice(&hcrc.to_le_bytes());
    let end = at + (HEADER + len + MARK) as u64;
    rec.extend_from_slice(&mark(gen, end));
    Ok(())
}

/// The payload length of the record at `at` of log `gen` if its header
/// checks (whatever its payload holds).
pub(crate) fn header_len(b: &[u8], gen: u64, at: usize) -> Option<usize> {
    let len = u32_at(b, at)?;
    let pcrc = u32_at(b, at + 4)?;
    if header_crc(gen, at as u64, len, pcrc) != u32_at(b, at + 8)? {
        return None;
    }
    let len = usize::try_from(len).ok()?;
    (len != 0 && len <= MAX_RECORD).then_some(len)
}

/// The payload of the whole record at `at` of log `gen` and the record's
/// end, if it checks.
pub(crate) fn record_at(b: &[u8], gen: u64, at: usize) -> Option<(&[u8], usize)> {
    let len = header_len(b, gen, at)?;
    let from = at + HEADER;
    let end = from.checked_add(len)?.checked_add(MARK)?;
    let payload = b.get(from..from + len)?;
    if payload_crc(gen, at as u64, payload) != u32_at(b, at + 4)?
        || b.get(end - MARK..end)? != mark(gen, end as u64)
    {
        return None;
    }
    Some((payload, end))
}

/// The payload of the whole version-1 record at `at` of log `gen` and its
/// end, if it checks.
pub(crate) fn record_at_v1(b: &[u8], gen: u64, at: usize) -> Option<(&[u8], usize)> {
    let len_bytes = b.get(at..at.checked_add(4)?)?;
    let len = usize::try_from(u32_at(b, at)?).ok()?;
    if len == 0 || len > MAX_RECORD {
        return None;
    }
    let sum = u32_at(b, at + 4)?;
    let from = at + HEADER_V1;
    let payload = b.get(from..from.checked_add(len)?)?;
    let want = crc(&[
        &gen.to_le_bytes(),
        &(at as u64).to_le_bytes(),
        len_bytes,
        payload,
    ]);
    (want == sum).then_some((payload, from + len))
}

/// How a log's bytes after its last whole record read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Tail {
    /// Room: fill (or zeros past the witnessed room).
    Room,
    /// A torn final write from the given offset: never acknowledged.
    Torn,
    /// Damage: not room, and not provably a torn final write.
    Damaged(String),
}

/// The first byte from `from` that is not room, if any.
pub(crate) fn first_not_room(b: &[u8], gen: u64, room: u64, from: usize) -> Option<usize> {
    let mut want = vec![0u8; 4096];
    let mut at = from;
    while at < b.len() {
        let n = (b.len() - at).min(want.len());
        fill(gen, at as u64, &mut want[..n]);
        for i in 0..n {
            if b[at + i] != want[i] && !(b[at + i] == 0 && (at + i) as u64 >= room) {
                return Some(at + i);
            }
        }
        at += n;
    }
    None
}

/// The end of the last byte from `from` on that is not room (`from` if
/// there is none).
pub(crate) fn end_of_written(b: &[u8], gen: u64, room: u64, from: usize) -> usize {
    let mut end = from;
    let mut at = from;
    while let Some(x) = first_not_room(b, gen, room, at) {
        end = x + 1;
        at = x + 1;
    }
    end
}

/// The payload of a record at `at` of log `gen` that does not check,
/// if it is intact all the same: taken up to `ends` (where the record
/// may end, its mark included), it matches the stored payload CRC, or the
/// stored header CRC once its own CRC is put in. So a record whose length,
/// either CRC or mark was damaged, but not its payload, is kept by a
/// repair.
pub(crate) fn intact_payload<'b>(
    b: &'b [u8],
    gen: u64,
    at: usize,
    ends: &[usize],
) -> Option<&'b [u8]> {
    let pcrc = u32_at(b, at + 4)?;
    let hcrc = u32_at(b, at + 8)?;
    ends.iter().find_map(|&end| {
        let from = at + HEADER;
        let to = end.checked_sub(MARK)?;
        if to <= from || to > b.len() {
            return None;
        }
        let payload = &b[from..to];
        let len = u32::try_from(payload.len()).ok()?;
        let own = payload_crc(gen, at as u64, payload);
        (own == pcrc || header_crc(gen, at as u64, len, own) == hcrc).then_some(payload)
    })
}

/// The first offset after `from` where a whole record of log `gen`
/// starts, if any: a record found after bytes that do not check proves
/// those bytes are damage, not a tear.
pub(crate) fn next_record(b: &[u8], gen: u64, from: usize) -> Option<usize> {
    (from + 1..b.len().saturating_sub(HEADER + MARK)).find(|&y| record_at(b, gen, y).is_some())
}

/// Whether `b[from..to]` holds a run of [`FILL_RUN`] fill bytes.
fn has_fill_run(b: &[u8], gen: u64, from: usize, to: usize) -> bool {
    let mut run = 0;
    let to = to.min(b.len());
    for (x, &v) in b.iter().enumerate().take(to).skip(from) {
        if v == fill_byte(gen, x as u64) {
            run += 1;
            if run >= FILL_RUN {
                return true;
            }
        } else {
            run = 0;
        }
    }
    false
}

/// Reads the bytes of log `gen` from `at`, the end of its last whole
/// record, to the end of the file (`room`: the witnessed synced length;
/// `newest`: no later log exists, so a torn final write is possible).
/// No record that checks may start after `at` (the caller looked).
pub(crate) fn tail(b: &[u8], gen: u64, room: u64, at: usize, newest: bool) -> Tail {
    if first_not_room(b, gen, room, at).is_none() {
        return Tail::Room;
    }
    let what = |s: &str| Tail::Damaged(s.to_string());
    if !newest {
        return what(
            "bytes after the last commit of a log that later logs follow are neither \
             a commit nor room (a crash tears only the newest log's last commit)",
        );
    }
    match header_len(b, gen, at) {
        Some(len) => {
            let end = at + HEADER + len + MARK;
            if end <= b.len() && first_not_room(b, gen, room, end).is_some() {
                return what("bytes that are neither a commit nor room follow the last commit");
            }
            if end > b.len() {
                return Tail::Torn;
            }
            // The last byte never written, the mark's others written or not.
            let last_unwritten = b[end - 1] == fill_byte(gen, (end - 1) as u64)
                && (end - MARK..end - 1).all(|x| {
                    let f = fill_byte(gen, x as u64);
                    b[x] == f || b[x] == !f
                });
            if last_unwritten || has_fill_run(b, gen, at + HEADER, end) {
                Tail::Torn
            } else {
                what(
                    "the last commit was written whole but does not check \
                     (a flipped bit or an overwritten sector, not a torn write)",
                )
            }
        }
        None => {
            // A header field still all fill was never written; nor was a
            // header whose last byte is fill with nothing after it.
            let is_fill = |y: usize| b[y] == fill_byte(gen, y as u64);
            let field_unwritten = (0..3).any(|f| {
                let x = at + 4 * f;
                x + 4 <= b.len() && (x..x + 4).all(is_fill)
            });
            let cut_in_header = at + HEADER <= b.len()
                && is_fill(at + HEADER - 1)
                && first_not_room(b, gen, room, at + HEADER).is_none();
            if field_unwritten || cut_in_header || b.len() < at + HEADER {
                Tail::Torn
            } else {
                what("the last commit's header does not check and was written whole")
            }
        }
    }
}

/// Every write in a damaged commit's bytes that still reads as a put of
/// a pending row with a printable key: (key, value). Looked for at every
/// offset, past pieces that do not decode; the value is trusted only if it
/// decodes and its own CRC checks (`engine::salvage_pending`).
pub(crate) fn pending_rows(payload: &[u8]) -> Vec<(&[u8], &[u8])> {
    let pending = Table::ALL.iter().position(|t| matches!(t, Table::Pending));
    let mut out = Vec::new();
    for i in 0..payload.len() {
        if payload.get(i) != Some(&1) || payload.get(i + 1).map(|&t| usize::from(t)) != pending {
            continue;
        }
        let Some(klen) = u32_at(payload, i + 2).and_then(|n| usize::try_from(n).ok()) else {
            continue;
        };
        if !(1..=256).contains(&klen) {
            continue;
        }
        let Some(k) = payload.get(i + 6..i + 6 + klen) else {
            continue;
        };
        if !k.iter().all(|c| c.is_ascii_graphic()) {
            continue;
        }
        let at = i + 6 + klen;
        let Some(vlen) = u32_at(payload, at).and_then(|n| usize::try_from(n).ok()) else {
            continue;
        };
        if let Some(v) = at
            .checked_add(4 + vlen)
            .and_then(|e| payload.get(at + 4..e))
        {
            out.push((k, v));
        }
    }
    out
}

/// The ids of the obligations whose pending or terminal rows a damaged
/// record's payload names, as far as its writes still decode.
pub(crate) fn obligations_named(payload: &[u8]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut c = 0usize;
    let mut next = || -> Option<(u8, u8, &[u8])> {
        let op = *payload.get(c)?;
        let t = *payload.get(c + 1)?;
        let klen = usize::try_from(u32_at(payload, c + 2)?).ok()?;
        let k = payload.get(c + 6..(c + 6).checked_add(klen)?)?;
        let mut end = c + 6 + klen;
        if op == 1 {
            let vlen = usize::try_from(u32_at(payload, end)?).ok()?;
            end = end.checked_add(4)?.checked_add(vlen)?;
            if end > payload.len() {
                return None;
            }
        } else if op != 2 {
            return None;
        }
        c = end;
        Some((op, t, k))
    };
    let names = |t: u8| {
        Table::ALL
            .get(usize::from(t))
            .is_some_and(|t| matches!(t, Table::Pending | Table::Terminal))
    };
    let mut add = |k: &[u8]| {
        if let Ok(id) = std::str::from_utf8(k) {
            if !out.iter().any(|o| o == id) {
                out.push(id.to_string());
            }
        }
    };
    while let Some((_, t, k)) = next() {
        if names(t) {
            add(k);
        }
    }
    // Past bytes that do not decode (a zeroed or overwritten piece), every
    // write header that still reads as one on a pending or finished row,
    // with a printable key, names its obligation.
    for i in 0..payload.len() {
        let (Some(&op), Some(&t)) = (payload.get(i), payload.get(i + 1)) else {
            break;
        };
        let Some(klen) = u32_at(payload, i + 2).and_then(|n| usize::try_from(n).ok()) else {
            continue;
        };
        if (op == 1 || op == 2) && names(t) && (1..=256).contains(&klen) {
            if let Some(k) = payload.get(i + 6..i + 6 + klen) {
                if k.iter().all(|c| c.is_ascii_graphic()) {
                    add(k);
                }
            }
        }
    }
    out
}
