//! [`ShardedMap`]: the hash map for state that grows with traffic.
//!
//! A hash map grows by doubling: the insert that crosses its load limit
//! allocates a table twice the size and moves every entry into it, on the
//! caller's thread, before it returns. For the maps that grow with every
//! obligation — the custodian's pending and terminal summaries, the
//! receiver's ledger and key sequences — that insert runs on a node's
//! driver, and every frame, commit and offer waits behind it. Measured on
//! the 2-core machine: one doubling of the receiver's ledger at
//! ~14,000 entries took 24 ms of CPU (1,321 page faults for the new
//! table), in the middle of a paced latency run. The share of obligations
//! that arrive during some doubling is about the rate times the cost of
//! moving one entry (~1 µs with its page faults), whatever the map's size,
//! since the pauses grow as the doublings thin out: at 10,000/s about one
//! in a hundred per growing map, which is the p99.
//!
//! A [`ShardedMap`] spreads its entries over [`SHARDS`] maps by a keyed
//! hash of the key once it holds [`SPLIT_AT`] entries. Each shard doubles
//! on its own, so one insert moves at most a shard's entries (or, once,
//! the [`SPLIT_AT`] entries of the split). `cargo run --release -p abhyasa --example
//! map_growth -- --map sharded|hash` (one map per process, entries of the
//! ledger's size, a lookup and an insert per step): at 1,000,000 entries
//! the longest step was 1.7–1.8 ms against 289–741 ms for one `HashMap`;
//! at 50,000, 1.2 ms (the split) against 6.6–8.4 ms. The mean step is the
//! same within noise (401–459 against 406–532 ns at 50,000): the extra
//! hash of the key that picks the shard is lost in the lookup's cache
//! misses.
//!
//! The hash that picks the shard and the bucket is keyed at random, as
//! [`crate::Map`]'s is, so a peer choosing ids can neither collide them in
//! one shard's table nor pile them into one shard.

use std::borrow::Borrow;
use std::hash::Hash;

use hashbrown::hash_table::{Entry, HashTable};

/// How many maps a [`ShardedMap`] spreads its entries over. With 256 a
/// shard of a 1,000,000-entry map holds ~4,000 entries, so its doubling
/// stays under 2 ms on the 2-core machine (64 shards: 6.3 ms). A map
/// splits into them only past [`SPLIT_AT`] entries.
pub const SHARDS: usize = 256;

/// Entries a [`ShardedMap`] holds in one map before it splits into
/// [`SHARDS`]. Below it the map is one table (a doubling moves at most
/// this many entries, well under a millisecond), so the many small maps
/// of simulations and of the model checker, which clones whole state
/// machines at every step, pay nothing for the shards: with 256 shards
/// from the start the checker's test ran 66.7 s against 16.6 s. The split
/// itself moves this many entries once.
pub const SPLIT_AT: usize = 2048;

/// A hash map whose growth never moves more than one shard at a time (see
/// the module docs). The subset of `HashMap`'s API the state machines use.
///
/// A key is hashed once per operation, with one keyed hasher: bits 32..40
/// of the hash pick the shard, and the shard's table takes its bucket from
/// the low bits and its tag from the top seven, so the three never
/// overlap. (Hashing twice, once to pick a shard and once inside it, cost
/// ~2% of the CPU of a best-effort obligation.)
#[derive(Clone)]
pub struct ShardedMap<K, V> {
    hasher: ahash::RandomState,
    /// One table until [`SPLIT_AT`] entries, then [`SHARDS`] (never back).
    shards: Vec<HashTable<(K, V)>>,
    len: usize,
}

impl<K, V> Default for ShardedMap<K, V> {
    fn default() -> Self {
        Self {
            hasher: ahash::RandomState::new(),
            shards: vec![HashTable::new()],
            len: 0,
        }
    }
}

impl<K: std::fmt::Debug, V: std::fmt::Debug> std::fmt::Debug for ShardedMap<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K, V> ShardedMap<K, V> {
    /// Entries in all shards.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No entries.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every entry, shard by shard (in no particular order, as a
    /// `HashMap`'s).
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.shards
            .iter()
            .flat_map(|s| s.iter().map(|(k, v)| (k, v)))
    }

    /// Every key.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.iter().map(|(k, _)| k)
    }

    /// Every value.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    /// Whether the entries are spread over [`SHARDS`] maps yet.
    pub fn is_split(&self) -> bool {
        self.shards.len() > 1
    }

    /// The shard of a key whose hash is `h`.
    fn shard(&self, h: u64) -> usize {
        if self.shards.len() == 1 {
            return 0;
        }
        (h >> 32) as usize % SHARDS
    }
}

impl<K: Hash + Eq, V> ShardedMap<K, V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// The shard `k` is (or would be) in.
    #[cfg(test)]
    fn shard_of<Q: Hash + ?Sized>(&self, k: &Q) -> usize {
        self.shard(self.hasher.hash_one(k))
    }

    /// From one table to [`SHARDS`], each entry under the hash it had.
    fn split(&mut self) {
        if self.is_split() {
            return;
        }
        let one = std::mem::take(&mut self.shards);
        let each = (self.len / SHARDS + 1) * 2;
        self.shards = (0..SHARDS)
            .map(|_| HashTable::with_capacity(each))
            .collect();
        for e in one.into_iter().flatten() {
            let h = self.hasher.hash_one(&e.0);
            let s = self.shard(h);
            self.shards[s].insert_unique(h, e, entry_hash(&self.hasher));
        }
    }

    /// The value of `k`.
    pub fn get<Q>(&self, k: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let h = self.hasher.hash_one(k);
        self.shards[self.shard(h)]
            .find(h, |(e, _)| e.borrow() == k)
            .map(|(_, v)| v)
    }

    /// The value of `k`, to change.
    pub fn get_mut<Q>(&mut self, k: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let h = self.hasher.hash_one(k);
        let s = self.shard(h);
        self.shards[s]
            .find_mut(h, |(e, _)| e.borrow() == k)
            .map(|(_, v)| v)
    }

    /// Whether `k` has a value.
    pub fn contains_key<Q>(&self, k: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(k).is_some()
    }

    /// Sets `k` to `v`; the value it had, if any.
    pub fn insert(&mut self, k: K, v: V) -> Option<V> {
        if self.len >= SPLIT_AT {
            self.split();
        }
        let h = self.hasher.hash_one(&k);
        let s = self.shard(h);
        match self.shards[s].entry(h, |(e, _)| *e == k, entry_hash(&self.hasher)) {
            Entry::Occupied(mut o) => Some(std::mem::replace(&mut o.get_mut().1, v)),
            Entry::Vacant(slot) => {
                slot.insert((k, v));
                self.len += 1;
                None
            }
        }
    }

    /// Removes `k`; the value it had, if any.
    pub fn remove<Q>(&mut self, k: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let h = self.hasher.hash_one(k);
        let s = self.shard(h);
        let entry = self.shards[s]
            .find_entry(h, |(e, _)| e.borrow() == k)
            .ok()?;
        let ((_, v), _) = entry.remove();
        self.len -= 1;
        Some(v)
    }

    /// Keeps the entries for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        for shard in self.shards.iter_mut() {
            shard.retain(|(k, v)| keep(k, v));
        }
        self.len = self.shards.iter().map(HashTable::len).sum();
    }

    /// Room for `additional` more entries, spread evenly over the shards
    /// (a recovery that knows its count allocates once).
    pub fn reserve(&mut self, additional: usize) {
        if self.len + additional < SPLIT_AT {
            if let Some(one) = self.shards.first_mut() {
                one.reserve(additional, entry_hash(&self.hasher));
            }
            return;
        }
        self.split();
        let each = additional.div_ceil(SHARDS);
        for shard in self.shards.iter_mut() {
            shard.reserve(each, entry_hash(&self.hasher));
        }
    }
}

/// The hash a table moves an entry under when it grows: its key's, as the
/// entry was placed.
fn entry_hash<K: Hash, V>(hasher: &ahash::RandomState) -> impl Fn(&(K, V)) -> u64 + '_ {
    move |e| hasher.hash_one(&e.0)
}

impl<K: Hash + Eq, V> FromIterator<(K, V)> for ShardedMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut m = Self::new();
        m.extend(iter);
        m
    }
}

impl<K: Hash + Eq, V> Extend<(K, V)> for ShardedMap<K, V> {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, iter: I) {
        for (k, v) in iter {
            self.insert(k, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16, u32),
        Remove(u16),
        Retain(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (0u16..20000, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            2 => (0u16..20000).prop_map(Op::Remove),
            1 => (0u16..1000).prop_map(Op::Retain),
        ]
    }

    proptest! {
        // Long sequences, so most cases cross SPLIT_AT and the split moves
        // a map with history (removals, retains) into the shards.
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Any sequence of inserts, removes and retains leaves the map
        /// holding exactly what an ordered map given the same sequence
        /// holds: every read agrees, and so does the count.
        #[test]
        fn behaves_as_a_map(ops in prop::collection::vec(op(), 3000..9000)) {
            let mut m = ShardedMap::<String, u32>::new();
            let mut model = BTreeMap::<String, u32>::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => {
                        let k = format!("ob-{k}");
                        prop_assert_eq!(m.insert(k.clone(), v), model.insert(k, v));
                    }
                    Op::Remove(k) => {
                        let k = format!("ob-{k}");
                        prop_assert_eq!(m.remove(k.as_str()), model.remove(&k));
                    }
                    Op::Retain(d) => {
                        // Drops about one entry in a thousand: the map
                        // still grows past SPLIT_AT.
                        m.retain(|_, v| *v % 1000 != u32::from(d));
                        model.retain(|_, v| *v % 1000 != u32::from(d));
                    }
                }
                prop_assert_eq!(m.len(), model.len());
            }
            let mut all: Vec<(String, u32)> = m.iter().map(|(k, v)| (k.clone(), *v)).collect();
            all.sort();
            prop_assert_eq!(all, model.clone().into_iter().collect::<Vec<_>>());
            for (k, v) in &model {
                prop_assert_eq!(m.get(k.as_str()), Some(v));
                prop_assert!(m.contains_key(k.as_str()));
            }
            prop_assert_eq!(m.get("ob-absent"), None);
        }
    }

    /// Entries spread over the shards, so no shard (and no doubling) holds
    /// much more than its share: the point of the type. A map that put
    /// everything in one shard would pass the model test above and fail
    /// here.
    #[test]
    fn entries_spread_over_the_shards() {
        let mut m = ShardedMap::<String, ()>::new();
        let n = 256 * 200;
        for i in 0..n {
            m.insert(format!("obligation-{i:08}"), ());
        }
        let largest = m.shards.iter().map(|s| s.len()).max().unwrap_or(0);
        let smallest = m.shards.iter().map(|s| s.len()).min().unwrap_or(0);
        // 200 expected per shard; a binomial spread stays well inside.
        assert!(largest < 300 && smallest > 120, "{smallest}..{largest}");
        assert_eq!(m.len(), n);
    }

    /// A map stays one `HashMap` up to SPLIT_AT entries (cheap to clone,
    /// as the model checker does at every step) and splits past it,
    /// keeping every entry.
    #[test]
    fn splits_only_when_large() {
        let mut m = ShardedMap::<String, usize>::new();
        for i in 0..SPLIT_AT {
            m.insert(format!("ob-{i}"), i);
        }
        assert!(!m.is_split());
        m.insert("one-more".into(), 0);
        assert!(m.is_split());
        assert_eq!(m.len(), SPLIT_AT + 1);
        assert!((0..SPLIT_AT).all(|i| m.get(format!("ob-{i}").as_str()) == Some(&i)));
        let mut r = ShardedMap::<String, ()>::new();
        r.reserve(SPLIT_AT);
        assert!(r.is_split() && r.is_empty());
    }

    /// Two maps pick shards differently: a peer cannot precompute ids that
    /// land in one shard of every node.
    #[test]
    fn the_shard_choice_is_keyed_at_random() {
        let split = || {
            let mut m = ShardedMap::<String, ()>::new();
            m.reserve(SPLIT_AT);
            m
        };
        let (a, b) = (split(), split());
        let ids: Vec<String> = (0..64).map(|i| format!("obligation-{i}")).collect();
        let pick =
            |m: &ShardedMap<String, ()>| ids.iter().map(|i| m.shard_of(i)).collect::<Vec<_>>();
        assert_ne!(pick(&a), pick(&b));
    }
}
