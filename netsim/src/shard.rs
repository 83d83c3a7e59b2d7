//! `--shard I/N`: one of N equal, contiguous slices of a sweep's transfer
//! index space, so a large sweep runs as N independent batch jobs whose
//! outputs `abhyasa-sim merge` combines into the one-machine result.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

/// Shard `index` of `count` (0-based: `0/3`, `1/3`, `2/3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shard {
    index: u32,
    count: u32,
}

/// Why a `--shard` value was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShardError {
    /// Not of the form `I/N`.
    #[error("expected I/N (for example 0/4), got {0:?}")]
    Syntax(String),
    /// `N` is zero.
    #[error("the shard count must be at least 1")]
    ZeroCount,
    /// `I` is not below `N`.
    #[error(
        "shard index {index} is out of range: indices run from 0 to {last} for {count} shards"
    )]
    IndexOutOfRange {
        /// The index given.
        index: u32,
        /// The count given.
        count: u32,
        /// The largest valid index.
        last: u32,
    },
}

impl Shard {
    /// Shard `index` of `count`.
    pub fn new(index: u32, count: u32) -> Result<Self, ShardError> {
        if count == 0 {
            return Err(ShardError::ZeroCount);
        }
        if index >= count {
            return Err(ShardError::IndexOutOfRange {
                index,
                count,
                last: count - 1,
            });
        }
        Ok(Self { index, count })
    }

    /// The whole sweep as one shard (`0/1`).
    pub const WHOLE: Shard = Shard { index: 0, count: 1 };

    /// This shard's index.
    pub fn index(self) -> u32 {
        self.index
    }

    /// The number of shards.
    pub fn count(self) -> u32 {
        self.count
    }

    /// The transfer indices of this shard within `first..first + total`:
    /// shard `i` of `n` gets `first + floor(i * total / n)` up to
    /// `first + floor((i + 1) * total / n)`, so the shards tile the range
    /// exactly and differ in size by at most one.
    pub fn range(self, first: u64, total: u64) -> Range<u64> {
        let cut = |i: u32| {
            let off = u128::from(total) * u128::from(i) / u128::from(self.count);
            // off <= total, so it fits a u64.
            first.saturating_add(u64::try_from(off).unwrap_or(total))
        };
        cut(self.index)..cut(self.index + 1)
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = ShardError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let syntax = || ShardError::Syntax(s.to_string());
        let (i, n) = s.trim().split_once('/').ok_or_else(syntax)?;
        let index = i.trim().parse::<u32>().map_err(|_| syntax())?;
        let count = n.trim().parse::<u32>().map_err(|_| syntax())?;
        Self::new(index, count)
    }
}

impl serde::Serialize for Shard {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Shard {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        assert_eq!("2/5".parse::<Shard>().unwrap(), Shard::new(2, 5).unwrap());
        assert_eq!("2/5".parse::<Shard>().unwrap().to_string(), "2/5");
        assert_eq!(
            "5/5".parse::<Shard>().unwrap_err(),
            ShardError::IndexOutOfRange {
                index: 5,
                count: 5,
                last: 4
            }
        );
        assert_eq!("0/0".parse::<Shard>().unwrap_err(), ShardError::ZeroCount);
        for bad in ["", "3", "a/b", "-1/3", "1/3/4", "1.5/3"] {
            assert!(
                matches!(bad.parse::<Shard>(), Err(ShardError::Syntax(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn shards_tile_the_range() {
        for (first, total, n) in [(0, 10, 3), (7, 1, 4), (0, 0, 2), (5, 1_000_003, 7)] {
            let mut next = first;
            for i in 0..n {
                let r = Shard::new(i, n).unwrap().range(first, total);
                assert_eq!(r.start, next);
                assert!(r.end - r.start <= total / u64::from(n) + 1);
                next = r.end;
            }
            assert_eq!(next, first + total);
        }
        assert_eq!(Shard::WHOLE.range(3, 9), 3..12);
        // No overflow near the top of the index space.
        let r = Shard::new(1, 2).unwrap().range(0, u64::MAX);
        assert_eq!(r.end, u64::MAX);
    }
}
