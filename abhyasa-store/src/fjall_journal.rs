//! A read-only look at fjall's journals before fjall opens them.
//!
//! fjall 3.1.13 replays a journal batch by batch (`Start`, its items,
//! `End` with an xxh3 checksum of the items) and, at the first entry it
//! cannot decode, truncates the file there and carries on as if the
//! journal ended: a torn final write and a zeroed sector in the middle of
//! the journal look the same to it, and every batch after the damage —
//! acknowledged commits — is dropped without a word (a checksum mismatch,
//! by contrast, is an error). [`check`] walks each journal as fjall will
//! and, where the walk stops before the end of the file, looks for a
//! whole batch with a valid checksum anywhere after that point. A torn
//! final write has nothing checked after it; damage does. Damage is
//! [`StoreError::Corrupt`] naming the file and offset, before fjall
//! has touched a byte.
//!
//! The journal's last batch gets one more look: a torn write leaves some
//! of its 512-byte sectors as they were before (fjall preallocates the
//! journal with zeros), never a wrong non-zero byte. A last batch that is
//! whole in shape, with no sector left zero, but whose checksum or end
//! marker does not match, is damage too.
//!
//! What it cannot tell: damage that removes the journal's last batches
//! (a truncation, zeros over the end of the written part, a zeroed sector
//! of the last batch) looks exactly like a torn write, and fjall drops
//! those batches; nothing in the journal says how far it was synced.

use std::path::Path;

use abhyasa_core::store::StoreError;

/// The bytes fjall ends every `End` entry with (its `MAGIC_BYTES`).
const END_MAGIC: &[u8] = b"FJL\x03";

const START: u8 = 1;
const ITEM: u8 = 2;
const END: u8 = 3;
const CLEAR: u8 = 4;

/// One entry read at an offset.
enum Entry {
    Start { items: u32 },
    Item,
    End { checksum: u64 },
    Clear,
}

/// Reads the entry at `at`: its kind, and where the next one starts.
fn entry(b: &[u8], at: usize) -> Option<(Entry, usize)> {
    let tag = *b.get(at)?;
    let u32_at =
        |o: usize| -> Option<u32> { Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?)) };
    match tag {
        START => {
            let items = u32_at(at + 1)?;
            b.get(at + 13 - 1)?;
            Some((Entry::Start { items }, at + 13))
        }
        ITEM => {
            // tag, value type, compression, keyspace id (8), key length
            // (2), value length (4), value length on disk (4), key, value.
            let value_type = *b.get(at + 1)?;
            let compression = *b.get(at + 2)?;
            if !matches!(value_type, 0 | 1 | 2 | 4) || compression != 0 {
                return None;
            }
            let key_len = u16::from_le_bytes(b.get(at + 11..at + 13)?.try_into().ok()?);
            let value_len = u32_at(at + 13)?;
            let on_disk = u32_at(at + 17)?;
            if value_len != on_disk {
                return None;
            }
            let end = (at + 21)
                .checked_add(usize::from(key_len))?
                .checked_add(usize::try_from(on_disk).ok()?)?;
            b.get(at..end)?;
            Some((Entry::Item, end))
        }
        END => {
            let checksum = u64::from_le_bytes(b.get(at + 1..at + 9)?.try_into().ok()?);
            if b.get(at + 9..at + 13)? != END_MAGIC {
                return None;
            }
            Some((Entry::End { checksum }, at + 13))
        }
        CLEAR => {
            b.get(at + 8)?;
            Some((Entry::Clear, at + 9))
        }
        _ => None,
    }
}

/// The end of the whole batch starting at `at` whose checksum holds, if
/// one does.
fn batch(b: &[u8], at: usize) -> Option<usize> {
    let (Entry::Start { items }, mut pos) = entry(b, at)? else {
        return None;
    };
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut left = items;
    loop {
        let (e, next) = entry(b, pos)?;
        match e {
            Entry::Item | Entry::Clear if left > 0 => {
                h.update(&b[pos..next]);
                left -= 1;
            }
            Entry::End { checksum } if left == 0 => {
                return (h.digest() == checksum).then_some(next);
            }
            _ => return None,
        }
        pos = next;
    }
}

/// The end of the batch starting at `at` if it is whole in shape (its
/// entries and their lengths read, an `End` tag where it must be),
/// whatever its checksum and end marker say.
fn shape(b: &[u8], at: usize) -> Option<usize> {
    let (Entry::Start { items }, mut pos) = entry(b, at)? else {
        return None;
    };
    for _ in 0..items {
        let (e, next) = entry(b, pos)?;
        if !matches!(e, Entry::Item | Entry::Clear) {
            return None;
        }
        pos = next;
    }
    (*b.get(pos)? == END && b.get(pos + 12).is_some()).then_some(pos + 13)
}

/// Whether some 512-byte sector of `b[from..to]` (as far as it lies in
/// that range) is all zeros: what a torn write leaves.
fn has_zero_sector(b: &[u8], from: usize, to: usize) -> bool {
    let mut s = from - from % 512;
    while s < to {
        let (lo, hi) = (s.max(from), (s + 512).min(to));
        if b[lo..hi].iter().all(|&x| x == 0) {
            return true;
        }
        s += 512;
    }
    false
}

/// Where fjall's replay of `b` stops: the end of its last whole batch
/// (fjall itself fails, loudly, on a whole batch whose checksum is wrong).
fn replay_end(b: &[u8]) -> usize {
    let mut pos = 0;
    while let Some(end) = batch(b, pos) {
        pos = end;
    }
    pos
}

/// Checks the journal bytes `b` of `file`.
fn check_bytes(file: &str, b: &[u8]) -> Result<(), StoreError> {
    let stop = replay_end(b);
    if b[stop..].iter().all(|&x| x == 0) {
        // Nothing after the last batch but fjall's preallocated zeros.
        return Ok(());
    }
    // A torn final write leaves zeros, never wrong bytes.
    if let Some(end) = shape(b, stop) {
        if !has_zero_sector(b, stop, end) {
            return Err(StoreError::Corrupt {
                table: "fjall journal",
                key: format!("{file} at byte {stop}"),
                detail: format!(
                    "the journal's last batch (bytes {stop}..{end}) is whole but does not \
                     check: the bytes of an acknowledged commit changed; a torn write would \
                     have left a sector of zeros (the store was not opened; nothing was changed)"
                ),
            });
        }
    }
    // A torn final write leaves no whole, checked batch after it.
    if let Some(found) = (stop + 1..b.len()).find(|&q| b[q] == START && batch(b, q).is_some()) {
        return Err(StoreError::Corrupt {
            table: "fjall journal",
            key: format!("{file} at byte {stop}"),
            detail: format!(
                "the journal does not decode from byte {stop}, but a whole batch with a valid \
                 checksum follows at byte {found}: the journal is damaged, not torn by a crash, \
                 and opening it would drop every commit after byte {stop} (the store was not \
                 opened; nothing was changed)"
            ),
        });
    }
    Ok(())
}

/// Checks every journal (`*.jnl`) in the fjall database directory `dir`.
pub(crate) fn check(dir: &Path) -> Result<(), StoreError> {
    let io = |source| StoreError::Io {
        op: "read fjall's journals",
        source,
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(e)),
    };
    for e in entries {
        let path = e.map_err(io)?.path();
        if path.extension().is_some_and(|x| x == "jnl") {
            let b = std::fs::read(&path).map_err(io)?;
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            check_bytes(&name, &b)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut e = vec![ITEM, 0, 0];
        e.extend_from_slice(&7u64.to_le_bytes());
        e.extend_from_slice(&(key.len() as u16).to_le_bytes());
        e.extend_from_slice(&(value.len() as u32).to_le_bytes());
        e.extend_from_slice(&(value.len() as u32).to_le_bytes());
        e.extend_from_slice(key);
        e.extend_from_slice(value);
        e
    }

    fn batch_bytes(seq: u64, items: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut out = vec![START];
        out.extend_from_slice(&(items.len() as u32).to_le_bytes());
        out.extend_from_slice(&seq.to_le_bytes());
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for (k, v) in items {
            let e = item(k, v);
            h.update(&e);
            out.extend_from_slice(&e);
        }
        out.push(END);
        out.extend_from_slice(&h.digest().to_le_bytes());
        out.extend_from_slice(END_MAGIC);
        out
    }

    fn journal() -> (Vec<u8>, Vec<usize>) {
        let mut b = Vec::new();
        let mut starts = Vec::new();
        for i in 0..6u64 {
            starts.push(b.len());
            let v = vec![b'a' + i as u8; 40];
            b.extend(batch_bytes(i, &[(b"key-1", &v), (b"key-2", &v)]));
        }
        b.extend(vec![0; 4096]);
        (b, starts)
    }

    // C-SD-1, C-SD-2: a torn final batch is a tear; a zeroed or flipped
    // one with whole batches after it is damage.
    #[test]
    fn damage_mid_journal_is_refused_a_torn_tail_is_not() {
        let (b, starts) = journal();
        assert_eq!(replay_end(&b), b.len() - 4096);
        check_bytes("0.jnl", &b).unwrap();
        // Torn: the last batch half written, zeros after.
        let mut torn = b.clone();
        let last = starts[5];
        torn[last + 20..].fill(0);
        check_bytes("0.jnl", &torn).unwrap();
        // Zeroed in the middle.
        let mut zeroed = b.clone();
        zeroed[starts[2]..starts[2] + 30].fill(0);
        let e = check_bytes("0.jnl", &zeroed).unwrap_err();
        assert!(
            e.to_string().contains(&format!("byte {}", starts[2])),
            "{e}"
        );
        // A length flipped in the middle.
        let mut flipped = b.clone();
        flipped[starts[1] + 13 + 11] ^= 0x40;
        assert!(check_bytes("0.jnl", &flipped).is_err());
        // The last batch's end marker or a value flipped: not a tear.
        let end = b.len() - 4096;
        for at in [end - 1, last + 40] {
            let mut last_flipped = b.clone();
            last_flipped[at] ^= 0x10;
            let e = check_bytes("0.jnl", &last_flipped).unwrap_err();
            assert!(e.to_string().contains("whole but does not check"), "{e}");
        }
    }
}
