//! SplitMix64: the core's one seeded random source.
//!
//! The core draws no randomness of its own: every draw comes from a seed
//! passed in by the embedding (the custodian's `seed`), so a seeded run
//! makes the same choices every time. [`mix`] is SplitMix64's finalizer,
//! used both as a counter-based draw (the custodian's retry jitter) and,
//! through [`SplitMix64`], as a stream (lease renewal jitter).

/// The golden-ratio increment of SplitMix64.
pub(crate) const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finalizer: a bijection on `u64` that spreads every input
/// bit over the output.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The top 53 bits of `z` as a float in `[0, 1)`.
pub(crate) fn unit(z: u64) -> f64 {
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// A SplitMix64 stream: one seed, one reproducible sequence of draws.
#[derive(Clone, Debug)]
pub(crate) struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// The stream of `seed`.
    pub(crate) fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix(self.state)
    }

    /// The next float in `[0, 1)`.
    pub(crate) fn next_f64(&mut self) -> f64 {
        unit(self.next_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_stream() {
        // The first outputs of SplitMix64 seeded with 1234567 (Vigna's
        // reference implementation).
        let mut r = SplitMix64::new(1_234_567);
        assert_eq!(r.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(r.next_u64(), 3_203_168_211_198_807_973);
    }

    #[test]
    fn floats_stay_in_the_unit_interval() {
        let mut r = SplitMix64::new(7);
        for _ in 0..10_000 {
            let u = r.next_f64();
            assert!((0.0..1.0).contains(&u), "{u}");
        }
        assert!(unit(u64::MAX) < 1.0);
        assert_eq!(unit(0), 0.0);
    }
}
