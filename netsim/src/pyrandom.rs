//! Bit-exact reproduction of CPython's `random.Random` (MT19937).
//!
//! [`PyRandom`] replays, draw for draw, the subset of CPython's `random`
//! module used by the public Python reference harness of the Abhyasa
//! protocol (`tests/test_fuzz_deliver_or_report.py`): integer seeding,
//! `getrandbits`, `random()`, `_randbelow`, `randint` and `choice`. It is the
//! deterministic source behind `--compat reference-v1`, so that a simulated
//! sweep produces exactly the same channel configurations and Bernoulli trials
//! as `random.Random(seed)` does in CPython (3.2 and later; checked against
//! CPython 3.11).
//!
//! The module depends only on `core`; it contains no `unsafe` code and never
//! panics.

use core::fmt;

/// Number of 32-bit words in the MT19937 state.
const N: usize = 624;
/// MT19937 middle word offset.
const M: usize = 397;
/// MT19937 twist matrix constant.
const MATRIX_A: u32 = 0x9908_b0df;
/// Most significant bit of a state word.
const UPPER_MASK: u32 = 0x8000_0000;
/// Least significant 31 bits of a state word.
const LOWER_MASK: u32 = 0x7fff_ffff;

/// MT19937 `init_genrand(s)`.
const fn init_genrand(s: u32) -> [u32; N] {
    let mut mt = [0u32; N];
    mt[0] = s;
    let mut k = 1;
    while k < N {
        mt[k] = 1_812_433_253u32
            .wrapping_mul(mt[k - 1] ^ (mt[k - 1] >> 30))
            .wrapping_add(k as u32);
        k += 1;
    }
    mt
}

/// The state `init_by_array` starts from.
const INIT_BY_ARRAY_BASE: [u32; N] = init_genrand(19_650_218);

/// A Mersenne Twister generator that reproduces CPython's `random.Random`.
///
/// `PyRandom::new(s)` yields the same stream as `random.Random(s)` for any
/// non-negative integer seed `s` representable as `u64`, and each method
/// consumes exactly the 32-bit outputs the corresponding CPython method
/// consumes, so interleaved calls stay in lock-step with Python.
#[derive(Clone, PartialEq, Eq)]
pub struct PyRandom {
    /// The 624-word MT19937 state.
    mt: [u32; N],
    /// Index of the next state word to temper; `N` forces a regeneration.
    index: usize,
}

impl fmt::Debug for PyRandom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PyRandom")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl PyRandom {
    /// Seeds the generator exactly as `random.Random(seed)` does in CPython.
    ///
    /// CPython splits the absolute value of an integer seed into 32-bit words,
    /// least significant first (zero becomes the single word `[0]`), and feeds
    /// them to MT19937's `init_by_array`. A `u64` therefore becomes one word
    /// when it is below 2^32 and two words otherwise.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        let lo = (seed & 0xffff_ffff) as u32;
        let hi = (seed >> 32) as u32;
        if hi == 0 {
            Self::from_key(&[lo])
        } else {
            Self::from_key(&[lo, hi])
        }
    }

    /// Seeds the generator from an explicit `init_by_array` key.
    ///
    /// This is the primitive behind [`PyRandom::new`]: `key` must be the
    /// seed's 32-bit words, least significant first, with no trailing zero
    /// words (CPython never produces any, except the single word `[0]` for a
    /// zero seed). An empty key is treated as `[0]`.
    #[must_use]
    pub fn from_key(key: &[u32]) -> Self {
        let key: &[u32] = if key.is_empty() { &[0] } else { key };
        // `init_by_array` always starts from `init_genrand(19650218)`;
        // that state is computed at compile time (a third of seeding).
        let mut rng = Self {
            mt: INIT_BY_ARRAY_BASE,
            index: N,
        };
        let mt = &mut rng.mt;
        let mut i: usize = 1;
        let mut j: usize = 0;
        for _ in 0..N.max(key.len()) {
            let prev = mt[i - 1] ^ (mt[i - 1] >> 30);
            // The key index `j` is added as a 32-bit value, as in CPython.
            mt[i] = (mt[i] ^ prev.wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            let prev = mt[i - 1] ^ (mt[i - 1] >> 30);
            mt[i] = (mt[i] ^ prev.wrapping_mul(1_566_083_941)).wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
        }
        mt[0] = 0x8000_0000;
        rng.index = N;
        rng
    }

    /// Regenerates all 624 state words (the MT19937 "twist").
    fn twist(&mut self) {
        let mt = &mut self.mt;
        let mag01 = |y: u32| if y & 1 == 0 { 0 } else { MATRIX_A };
        for kk in 0..N - M {
            let y = (mt[kk] & UPPER_MASK) | (mt[kk + 1] & LOWER_MASK);
            mt[kk] = mt[kk + M] ^ (y >> 1) ^ mag01(y);
        }
        for kk in N - M..N - 1 {
            let y = (mt[kk] & UPPER_MASK) | (mt[kk + 1] & LOWER_MASK);
            mt[kk] = mt[kk + M - N] ^ (y >> 1) ^ mag01(y);
        }
        let y = (mt[N - 1] & UPPER_MASK) | (mt[0] & LOWER_MASK);
        mt[N - 1] = mt[M - 1] ^ (y >> 1) ^ mag01(y);
        self.index = 0;
    }

    /// Returns the next tempered 32-bit output (MT19937 `genrand_uint32`).
    ///
    /// Equivalent to CPython's `getrandbits(32)`.
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.twist();
        }
        let mut y = self.mt[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    /// Returns a float in `[0, 1)` exactly as CPython's `random()` does.
    ///
    /// Consumes two outputs `a`, `b` and returns
    /// `((a >> 5) * 2^26 + (b >> 6)) / 2^53`, a multiple of 2^-53.
    pub fn random(&mut self) -> f64 {
        let a = f64::from(self.next_u32() >> 5);
        let b = f64::from(self.next_u32() >> 6);
        (a * 67_108_864.0 + b) / 9_007_199_254_740_992.0
    }

    /// Returns `k` random bits exactly as CPython's `getrandbits(k)` does.
    ///
    /// For `k <= 32` this consumes one output and keeps its top `k` bits. For
    /// `32 < k <= 64` it consumes two outputs: the first becomes the low 32
    /// bits, and the second, shifted right by `64 - k`, the high bits
    /// (CPython fills 32-bit words least significant first and drops the low
    /// bits of the last word). `k == 0` returns 0 without consuming anything,
    /// like CPython 3.9+. Values of `k` above 64 are treated as 64.
    pub fn getrandbits(&mut self, k: u32) -> u64 {
        let k = k.min(64);
        if k == 0 {
            0
        } else if k <= 32 {
            u64::from(self.next_u32() >> (32 - k))
        } else {
            let lo = u64::from(self.next_u32());
            let hi = u64::from(self.next_u32() >> (64 - k));
            (hi << 32) | lo
        }
    }

    /// `getrandbits` for `k <= 128`, used for ranges wider than `u64`.
    fn getrandbits_u128(&mut self, k: u32) -> u128 {
        let k = k.min(128);
        let mut acc: u128 = 0;
        let mut shift: u32 = 0;
        while shift < k {
            let remaining = k - shift;
            let word = self.next_u32();
            let word = if remaining < 32 {
                word >> (32 - remaining)
            } else {
                word
            };
            acc |= u128::from(word) << shift;
            shift += 32;
        }
        acc
    }

    /// Rejection sampling below `n` with `bit_length(n)`-bit draws.
    fn randbelow_u128(&mut self, n: u128) -> u128 {
        if n == 0 {
            return 0;
        }
        let k = 128 - n.leading_zeros();
        loop {
            let r = self.getrandbits_u128(k);
            if r < n {
                return r;
            }
        }
    }

    /// Returns a uniform integer in `[0, n)` exactly as CPython's
    /// `_randbelow(n)` (`_randbelow_with_getrandbits`) does.
    ///
    /// With `k = n.bit_length()` (not that of `n - 1`), it draws
    /// `getrandbits(k)` until the value is below `n`; each rejected draw
    /// consumes outputs too. `n == 0`, for which Python raises, returns 0
    /// without consuming anything.
    pub fn randbelow(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let k = 64 - n.leading_zeros();
        loop {
            let r = self.getrandbits(k);
            if r < n {
                return r;
            }
        }
    }

    /// Returns a uniform integer in `[a, b]` exactly as CPython's
    /// `randint(a, b)` does: `a + _randbelow(b - a + 1)`.
    ///
    /// The full `i64` range is supported (its width 2^64 is drawn with
    /// 65-bit draws, as in Python). `b < a`, for which Python raises, returns
    /// `a` without consuming anything.
    pub fn randint(&mut self, a: i64, b: i64) -> i64 {
        if b < a {
            return a;
        }
        let width = (i128::from(b) - i128::from(a) + 1).unsigned_abs();
        let offset = self.randbelow_u128(width);
        // `offset < width`, so `a + offset` lies in `[a, b]` and fits an i64.
        let value = i128::from(a) + offset as i128;
        i64::try_from(value).unwrap_or(b)
    }

    /// Returns the index CPython's `choice(seq)` picks for `len(seq) == len`,
    /// that is `_randbelow(len)`.
    ///
    /// `len == 0`, for which Python raises `IndexError`, returns 0 without
    /// consuming anything.
    pub fn choice_index(&mut self, len: usize) -> usize {
        let n = u64::try_from(len).unwrap_or(u64::MAX);
        let r = self.randbelow(n);
        // `r < len`, so the conversion cannot fail.
        usize::try_from(r).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    //! Vectors generated with CPython 3.11.7 (`random.Random`).

    use super::PyRandom;

    struct Vectors {
        seed: u64,
        u32_first5: [u32; 5],
        /// Outputs number 623, 624, 625, 1247, 1248 and 1999 (0-based) of
        /// `getrandbits(32)`, straddling the state regenerations.
        u32_at_623_624_625_1247_1248_1999: [u32; 6],
        random_first5: [f64; 5],
        /// `[getrandbits(k) for k in range(1, 65)]` from a fresh generator.
        getrandbits_1_to_64: [u64; 64],
        /// `[_randbelow(3) for _ in range(20)]`.
        randbelow3_x20: [u64; 20],
        randint_0_2p31m1_x8: [i64; 8],
        randint_m1000_1000_x8: [i64; 8],
        /// `randint(-2**63, 2**63 - 1)`, width 2^64 (65-bit draws).
        randint_i64_full_x4: [i64; 4],
        /// `_randbelow(2**64 - 1)`.
        randbelow_u64max_x4: [u64; 4],
        /// Three `_randbelow(1)` then one `getrandbits(32)`.
        randbelow1_x3_then_u32: [u64; 4],
        /// `[choice(range(7)) for _ in range(10)]`.
        choice_index7_x10: [usize; 10],
    }

    const VECTORS: &[Vectors] = &[
        Vectors {
            seed: 0,
            u32_first5: [3626764237, 1654615998, 3255389356, 3823568514, 1806341205],
            u32_at_623_624_625_1247_1248_1999: [
                2390040247, 2229104038, 1244770883, 577331751, 2465233080, 3908016617,
            ],
            random_first5: [
                0.8444218515250481,
                0.7579544029403025,
                0.420571580830845,
                0.25891675029296335,
                0.5112747213686085,
            ],
            getrandbits_1_to_64: [
                1,
                1,
                6,
                14,
                13,
                2,
                33,
                247,
                261,
                497,
                829,
                3761,
                6420,
                13596,
                9938,
                63425,
                62468,
                93860,
                305860,
                934973,
                1904450,
                916215,
                4233620,
                2336625,
                9456908,
                9378180,
                101442323,
                25455938,
                331984327,
                858351976,
                537958267,
                4240245955,
                8202297706,
                12810966069,
                20659725726,
                12464707851,
                14216975577,
                20314472699,
                467716949020,
                363714941482,
                1230388484183,
                1555210669556,
                2780708594338,
                11268322956985,
                7197991573436,
                38882195506113,
                62304844337158,
                146749864080286,
                35060936843203,
                1034102733426106,
                2062634630745766,
                420056451792040,
                7566867883266284,
                12794786597129393,
                28284325986896460,
                45055150402573953,
                88183662935991621,
                238672988321029759,
                192039334539114282,
                841953877580378474,
                1622489236798216138,
                290463707049702376,
                8458007108886578636,
                4089715063379223119,
            ],
            randbelow3_x20: [1, 1, 0, 1, 2, 1, 1, 1, 1, 1, 2, 0, 2, 0, 1, 0, 0, 2, 1, 2],
            randint_0_2p31m1_x8: [
                1654615998, 1806341205, 173879092, 1112038970, 2087043557, 1739178872, 1302718217,
                2046968324,
            ],
            randint_m1000_1000_x8: [729, -212, 552, 823, -139, -918, -470, 977],
            randint_i64_full_x4: [
                -1465195632138975614,
                6084712057446794809,
                -431710025170174585,
                86457306059627737,
            ],
            randbelow_u64max_x4: [
                7106521602475165645,
                16422101724900707500,
                746805015404516437,
                17809683713383489082,
            ],
            randbelow1_x3_then_u32: [0, 0, 0, 1112038970],
            choice_index7_x10: [6, 3, 6, 3, 0, 2, 4, 3, 3, 6],
        },
        Vectors {
            seed: 1,
            u32_first5: [577090037, 2444712010, 3639700191, 3445702192, 3280387012],
            u32_at_623_624_625_1247_1248_1999: [
                802355090, 1360367077, 3404757168, 1721233950, 1032912167, 1058062369,
            ],
            random_first5: [
                0.13436424411240122,
                0.8474337369372327,
                0.763774618976614,
                0.2550690257394217,
                0.49543508709194095,
            ],
            getrandbits_1_to_64: [
                0,
                2,
                6,
                12,
                24,
                4,
                32,
                30,
                253,
                779,
                920,
                1934,
                5337,
                6219,
                25844,
                13759,
                12302,
                127888,
                14862,
                936710,
                1752726,
                1634976,
                3630313,
                10191118,
                25577875,
                51483077,
                282669,
                186786213,
                239115429,
                285970256,
                1549495423,
                3443818037,
                5277493553,
                4059906722,
                12461536057,
                131383004,
                86008635065,
                2325348894,
                485069952074,
                753256536527,
                2131234066143,
                3192973677813,
                4638689408903,
                13435609860349,
                33043064120992,
                38905943264532,
                48650095651897,
                190512855912927,
                428372387825833,
                1072133185245844,
                2086307378438314,
                1874306640402805,
                8253028069769886,
                16612673897876039,
                3602891909457747,
                45349654238825863,
                104287372192469808,
                85428715687081149,
                428394882029233392,
                1032528131005317878,
                2244166908279731112,
                2309530967541328375,
                8920940196447031804,
                9365730164212708441,
            ],
            randbelow3_x20: [0, 2, 0, 1, 0, 1, 1, 1, 2, 1, 0, 0, 1, 0, 1, 1, 2, 0, 2, 1],
            randint_0_2p31m1_x8: [
                577090037, 271041745, 1095513148, 506456969, 2127877499, 1930549411, 2028277857,
                1630434966,
            ],
            randint_m1000_1000_x8: [-725, 165, 735, 643, 564, -871, -478, -759],
            randint_i64_full_x4: [
                4865782901354085936,
                -7048155917072976836,
                -931725450029404348,
                -7491968275375482579,
            ],
            randbelow_u64max_x4: [
                10499958131665514997,
                14799178230035213023,
                1164115433906158532,
                2175216119781798972,
            ],
            randbelow1_x3_then_u32: [0, 0, 0, 506456969],
            choice_index7_x10: [1, 4, 6, 6, 6, 0, 2, 0, 3, 6],
        },
        Vectors {
            seed: 4294967301,
            u32_first5: [675479763, 2085189291, 1213270837, 3822202474, 2596110301],
            u32_at_623_624_625_1247_1248_1999: [
                3470195681, 3856972768, 3653217955, 2011993071, 2711265084, 2579533449,
            ],
            random_first5: [
                0.15727238718789782,
                0.2824866316461999,
                0.6044540318498407,
                0.014523449205355199,
                0.6277755437144577,
            ],
            getrandbits_1_to_64: [
                0,
                1,
                2,
                14,
                19,
                53,
                1,
                90,
                321,
                175,
                1592,
                3901,
                7609,
                13528,
                21721,
                63829,
                64982,
                191447,
                185827,
                981774,
                1582025,
                3902759,
                6830545,
                4064901,
                10562333,
                49192610,
                90628621,
                224277506,
                429077628,
                849601683,
                1899549694,
                2933618875,
                5141631609,
                2158882616,
                14615871083,
                55055421994,
                122939415690,
                260986083870,
                76565105578,
                555855149873,
                38338817699,
                2774188824413,
                3260368811092,
                12198520181295,
                10100145739080,
                40359499482962,
                42571159976738,
                142470206191386,
                305390415541279,
                24912657995279,
                520505335044380,
                760036824860977,
                8198326351555066,
                9769419573021761,
                16379978874433094,
                17579283306256642,
                30216655570116966,
                45088125111014108,
                524520825671801776,
                1142250344894343194,
                1396990728912025193,
                2497141793817981475,
                6921179440232927155,
                1257351035792393845,
            ],
            randbelow3_x20: [0, 1, 1, 2, 0, 1, 2, 0, 2, 1, 2, 1, 0, 1, 2, 2, 2, 0, 2, 0],
            randint_0_2p31m1_x8: [
                675479763, 2085189291, 1213270837, 62377729, 1524997693, 735810335, 2129333703,
                1522296832,
            ],
            randint_m1000_1000_x8: [-678, -6, -422, 822, 237, 710, -971, -273],
            randint_i64_full_x4: [
                -267552225364868909,
                5797155785632160870,
                3376425093997635580,
                48958198924335318,
            ],
            randbelow_u64max_x4: [
                8955819811489906899,
                16416234625733561141,
                15409031377063870429,
                6549815217972825857,
            ],
            randbelow1_x3_then_u32: [0, 0, 0, 3822202474],
            choice_index7_x10: [1, 3, 2, 4, 6, 0, 2, 5, 1, 6],
        },
        Vectors {
            seed: 9223372036854775808,
            u32_first5: [2377109768, 1691753470, 4039908392, 899083848, 1039357674],
            u32_at_623_624_625_1247_1248_1999: [
                3239629188, 346131666, 1859507527, 3126662580, 3566289627, 661445832,
            ],
            random_first5: [
                0.5534639983914199,
                0.9406144709090462,
                0.24199432111690833,
                0.8512870110731147,
                0.08475572881914784,
            ],
            getrandbits_1_to_64: [
                1,
                1,
                7,
                3,
                7,
                62,
                108,
                128,
                43,
                365,
                1544,
                1364,
                4121,
                5000,
                15020,
                42676,
                87742,
                252724,
                99745,
                254796,
                55256,
                2810390,
                785095,
                13666320,
                12024522,
                65027461,
                73465369,
                217614371,
                417443700,
                175481248,
                1571880014,
                797394150,
                5373663065,
                12847996818,
                10318873414,
                27210938414,
                98308919174,
                241002078618,
                193034355078,
                303874733686,
                567109197841,
                1054677454020,
                7538968749594,
                14521923090829,
                25995877645875,
                26803114282181,
                52048098058513,
                280384889179906,
                74200563206020,
                726357475172441,
                1789289354682922,
                765338454830700,
                3495924818338840,
                11409305226601662,
                35175325660840058,
                13791574327019292,
                79090943238568404,
                253850553994009414,
                350662783559363180,
                480177449235052061,
                882579886867322506,
                2246237705805071399,
                4003880896528229804,
                2681458196365736084,
            ],
            randbelow3_x20: [2, 1, 0, 0, 2, 0, 1, 1, 2, 1, 1, 2, 2, 0, 0, 0, 2, 0, 1, 2],
            randint_0_2p31m1_x8: [
                1691753470, 899083848, 1039357674, 364023093, 1533690558, 1430957640, 1310961893,
                1968830774,
            ],
            randint_m1000_1000_x8: [133, -194, 926, -572, -505, 984, 743, 28],
            randint_i64_full_x4: [
                39555359667253787,
                4685975845941691070,
                -3592833577956542095,
                -4740944711945802115,
            ],
            randbelow_u64max_x4: [
                7266025828921626888,
                3861535727561743400,
                17878840250213816042,
                9262927396522029595,
            ],
            randbelow1_x3_then_u32: [0, 0, 0, 4162741883],
            choice_index7_x10: [4, 3, 1, 1, 6, 4, 0, 2, 6, 2],
        },
        Vectors {
            seed: 20260609,
            u32_first5: [1167368707, 702297164, 2136653691, 1281957700, 3907191506],
            u32_at_623_624_625_1247_1248_1999: [
                2066348264, 523783763, 1414387043, 2161969124, 4136790868, 797101592,
            ],
            random_first5: [
                0.27179920795199497,
                0.497478450078361,
                0.9097139146026658,
                0.9719308029470866,
                0.8980264626698982,
            ],
            getrandbits_1_to_64: [
                0,
                0,
                3,
                4,
                29,
                47,
                124,
                37,
                459,
                515,
                1491,
                2197,
                5098,
                4812,
                793,
                36253,
                82392,
                242176,
                384496,
                544013,
                892980,
                2157064,
                4753274,
                2830189,
                28764823,
                8941104,
                29969037,
                108599778,
                121083460,
                621774996,
                316372579,
                1864375234,
                8050683298,
                13385279221,
                12501352673,
                37355664265,
                133463968390,
                12523123332,
                362486552493,
                453073223155,
                1625891199356,
                2671341714095,
                2796550759923,
                13548565161463,
                14561953382422,
                40954283303437,
                80154193981895,
                90208492434396,
                295166634282766,
                935963089261986,
                2146990568239724,
                3227779117605304,
                7863009637445744,
                17951325897406100,
                10654429219664222,
                6907189041746054,
                42926348937913584,
                258635698243233971,
                399613414821502739,
                403186908690347541,
                2297967178620119864,
                484803391700548535,
                8775209478792254792,
                9557729042502286421,
            ],
            randbelow3_x20: [1, 0, 1, 1, 2, 0, 2, 2, 2, 2, 1, 0, 2, 2, 2, 2, 1, 2, 2, 0],
            randint_0_2p31m1_x8: [
                1167368707, 702297164, 2136653691, 1281957700, 621798200, 1261672054, 103940173,
                1828823833,
            ],
            randint_m1000_1000_x8: [-444, -666, 18, -389, 863, 531, 990, -704],
            randint_i64_full_x4: [
                -6207028684233858557,
                -3804531823974491751,
                347013745550951465,
                1229189899675509174,
            ],
            randbelow_u64max_x4: [
                3016343352620917251,
                5505966398492032891,
                13797349912777786066,
                2670602937886078235,
            ],
            randbelow1_x3_then_u32: [0, 0, 0, 1281957700],
            choice_index7_x10: [2, 1, 3, 2, 5, 1, 4, 5, 4, 4],
        },
        Vectors {
            seed: 18446744073709551615,
            u32_first5: [93740670, 1068495656, 1452108352, 2657516307, 910393425],
            u32_at_623_624_625_1247_1248_1999: [
                2799746052, 3597309115, 1388219846, 1341629042, 641403452, 4117718281,
            ],
            random_first5: [
                0.021825695401270107,
                0.3380953268613758,
                0.21196748656082065,
                0.6151259995625727,
                0.9195709817171983,
            ],
            getrandbits_1_to_64: [
                0,
                0,
                2,
                9,
                6,
                29,
                78,
                24,
                470,
                922,
                759,
                3145,
                5997,
                11395,
                24331,
                3562,
                96616,
                50475,
                382714,
                558250,
                985046,
                2761637,
                7369866,
                15934311,
                2625192,
                53757225,
                44267128,
                129765872,
                140729055,
                298449059,
                1266300489,
                157547622,
                1349173708,
                14157176817,
                11049954608,
                32705125010,
                104682340202,
                95097643200,
                131138940066,
                924434078510,
                1836921949192,
                1426943793957,
                4394097811090,
                8284952182940,
                3827598190195,
                9960096543749,
                82909177190337,
                259530964503444,
                141572603388321,
                697093318744941,
                92939878156017,
                3660039151896327,
                5546992525814682,
                218640762212790,
                15959678110249270,
                37597050758511876,
                63708022738594728,
                4895215995070679,
                184793100288931707,
                784377231845638790,
                11445135694636033,
                1454175681917644591,
                338672473761362685,
                7036892270691269417,
            ],
            randbelow3_x20: [0, 0, 1, 2, 0, 1, 2, 0, 1, 2, 2, 2, 0, 2, 0, 2, 2, 1, 2, 0],
            randint_0_2p31m1_x8: [
                93740670, 1068495656, 1452108352, 910393425, 1958779474, 408097150, 1593622763,
                233445913,
            ],
            randint_m1000_1000_x8: [-956, -491, -308, 267, -566, -66, 259, -806],
            randint_i64_full_x4: [
                -4634218138322968962,
                -5313262047328830701,
                4374190751146973721,
                597471580831829410,
            ],
            randbelow_u64max_x4: [
                4589153898531806846,
                11413945628603804224,
                8412893781816475729,
                1752763915482752451,
            ],
            randbelow1_x3_then_u32: [0, 0, 0, 2657516307],
            choice_index7_x10: [0, 1, 2, 4, 1, 3, 4, 0, 2, 6],
        },
    ];

    #[test]
    fn matches_cpython_vectors() {
        for v in VECTORS {
            let s = v.seed;

            let mut r = PyRandom::new(s);
            let got: Vec<u32> = (0..5).map(|_| r.next_u32()).collect();
            assert_eq!(got, v.u32_first5, "u32 seed {s}");

            let mut r = PyRandom::new(s);
            let all: Vec<u32> = (0..2000).map(|_| r.next_u32()).collect();
            let late = [
                all[623], all[624], all[625], all[1247], all[1248], all[1999],
            ];
            assert_eq!(late, v.u32_at_623_624_625_1247_1248_1999, "late seed {s}");

            let mut r = PyRandom::new(s);
            for (i, want) in v.random_first5.iter().enumerate() {
                let got = r.random();
                assert_eq!(got.to_bits(), want.to_bits(), "random #{i} seed {s}");
            }

            let mut r = PyRandom::new(s);
            let got: Vec<u64> = (1..=64).map(|k| r.getrandbits(k)).collect();
            assert_eq!(got, v.getrandbits_1_to_64, "getrandbits seed {s}");

            let mut r = PyRandom::new(s);
            let got: Vec<u64> = (0..20).map(|_| r.randbelow(3)).collect();
            assert_eq!(got, v.randbelow3_x20, "randbelow(3) seed {s}");

            let mut r = PyRandom::new(s);
            let got: Vec<i64> = (0..8).map(|_| r.randint(0, (1 << 31) - 1)).collect();
            assert_eq!(got, v.randint_0_2p31m1_x8, "randint(0, 2^31-1) seed {s}");

            let mut r = PyRandom::new(s);
            let got: Vec<i64> = (0..8).map(|_| r.randint(-1000, 1000)).collect();
            assert_eq!(
                got, v.randint_m1000_1000_x8,
                "randint(-1000, 1000) seed {s}"
            );

            let mut r = PyRandom::new(s);
            let got: Vec<i64> = (0..4).map(|_| r.randint(i64::MIN, i64::MAX)).collect();
            assert_eq!(got, v.randint_i64_full_x4, "randint(full) seed {s}");

            let mut r = PyRandom::new(s);
            let got: Vec<u64> = (0..4).map(|_| r.randbelow(u64::MAX)).collect();
            assert_eq!(got, v.randbelow_u64max_x4, "randbelow(2^64-1) seed {s}");

            let mut r = PyRandom::new(s);
            let mut got: Vec<u64> = (0..3).map(|_| r.randbelow(1)).collect();
            got.push(u64::from(r.next_u32()));
            assert_eq!(got, v.randbelow1_x3_then_u32, "randbelow(1) seed {s}");

            let mut r = PyRandom::new(s);
            let got: Vec<usize> = (0..10).map(|_| r.choice_index(7)).collect();
            assert_eq!(got, v.choice_index7_x10, "choice seed {s}");
        }
    }

    /// The reference harness's master draws: per transfer `random()` for
    /// drop, duplicate and ack-drop, `choice([applied, applied, declined])`
    /// and `randint(0, 2**31 - 1)` for the channel seed, from
    /// `random.Random(20260609)`.
    #[test]
    fn reference_v1_master_draws() {
        // (drop, duplicate, ack_drop, decision index, channel seed)
        const WANT: [(f64, f64, f64, usize, i64); 10] = [
            (
                0.27179920795199497,
                0.497478450078361,
                0.9097139146026658,
                0,
                1261672054,
            ),
            (
                0.02420045847578456,
                0.6286065200256432,
                0.7333681696564827,
                1,
                724528516,
            ),
            (
                0.8572585518153968,
                0.22328672859494159,
                0.22553552373553132,
                0,
                1864375234,
            ),
            (
                0.8744457786391227,
                0.11650317875778804,
                0.9106979916654677,
                2,
                319982214,
            ),
            (
                0.9981523298901831,
                0.03881886897964271,
                0.6638464591602248,
                1,
                527050227,
            ),
            (
                0.3180517220582598,
                0.77015502355232,
                0.413829039127692,
                2,
                1514303943,
            ),
            (
                0.569541210691307,
                0.3204818728375822,
                0.5243176660575652,
                0,
                1270107034,
            ),
            (
                0.2704286880482474,
                0.4529250211854382,
                0.09384016616137947,
                2,
                1989375509,
            ),
            (
                0.3497088945924438,
                0.9965844060124291,
                0.10512497383906327,
                2,
                229055075,
            ),
            (
                0.7850555694722205,
                0.5354021095967811,
                0.32275671706135434,
                2,
                5792814,
            ),
        ];
        let mut master = PyRandom::new(20_260_609);
        for (i, want) in WANT.iter().enumerate() {
            let drop = master.random();
            let duplicate = master.random();
            let ack_drop = master.random();
            let decision = master.choice_index(3);
            let seed = master.randint(0, (1 << 31) - 1);
            assert_eq!(drop.to_bits(), want.0.to_bits(), "drop #{i}");
            assert_eq!(duplicate.to_bits(), want.1.to_bits(), "duplicate #{i}");
            assert_eq!(ack_drop.to_bits(), want.2.to_bits(), "ack_drop #{i}");
            assert_eq!(decision, want.3, "decision #{i}");
            assert_eq!(seed, want.4, "channel seed #{i}");
        }
        // Transfer 0, spelled out: applied (index 0 of [applied, applied,
        // declined]) with channel seed 1261672054.
        let mut master = PyRandom::new(20_260_609);
        assert!((master.random() - 0.271_799).abs() < 1e-6);
        assert!((master.random() - 0.497_478).abs() < 1e-6);
        assert!((master.random() - 0.909_714).abs() < 1e-6);
        assert_eq!(master.choice_index(3), 0);
        assert_eq!(master.randint(0, (1 << 31) - 1), 1_261_672_054);
    }

    #[test]
    fn seed_words_follow_cpython() {
        assert_eq!(PyRandom::new(0), PyRandom::from_key(&[0]));
        assert_eq!(PyRandom::new(0), PyRandom::from_key(&[]));
        assert_eq!(PyRandom::new((1 << 32) + 5), PyRandom::from_key(&[5, 1]));
        assert_eq!(
            PyRandom::new(1 << 63),
            PyRandom::from_key(&[0, 0x8000_0000])
        );
        assert_ne!(PyRandom::new(1 << 32), PyRandom::new(0));
    }

    #[test]
    fn degenerate_arguments_consume_nothing() {
        let mut a = PyRandom::new(7);
        let b = PyRandom::new(7);
        assert_eq!(a.getrandbits(0), 0);
        assert_eq!(a.randbelow(0), 0);
        assert_eq!(a.randint(5, 4), 5);
        assert_eq!(a.choice_index(0), 0);
        assert_eq!(a, b);
        assert_eq!(a.getrandbits(65), PyRandom::new(7).getrandbits(64));
    }
}
