//! Test data and the host mirrors of the kernels' number formats.
//!
//! Tokens are random but chosen so that every conversion the kernels make is exact: each
//! 128-channel block is a power of two `2^s` (s in -3..=3) times random e4m3 values, with one
//! element of the block at ±448 (the e4m3 maximum). Then the kernel's amax is `448·2^s`, its
//! FP8 scale `448/amax = 2^-s` and scale-inverse `amax/448 = 2^s` are exact, `x·scale` is an
//! e4m3 value exactly, and the stand-in experts' `x·(8+j)/8` fits bf16's 8 significant bits.
//! So the host predicts every received byte, and a single wrong row cannot hide in rounding.
//! No zero codes: zeros hide unwritten outputs.

use eptwin_engine::api::splitmix64;
use half::bf16;

/// bf16 code -> f32 (exact).
pub fn bf16_to_f32(h: u16) -> f32 {
    bf16::from_bits(h).to_f32()
}

/// f32 -> bf16 code, round to nearest even: for finite inputs bit for bit what `f32_to_bf16` in
/// common.cuh computes (tested against that formula).
pub fn f32_to_bf16(f: f32) -> u16 {
    bf16::from_f32(f).to_bits()
}

/// e4m3 -> f32 (exact), as `e4m3_to_f32` in common.cuh.
pub fn e4m3_to_f32(v: u8) -> f32 {
    let sign = v >> 7;
    let exp = ((v >> 3) & 0xf) as u32;
    let man = (v & 7) as u32;
    let mag = if exp == 0 {
        man as f32 * 0.001953125
    } else {
        f32::from_bits(((exp + 120) << 23) | (man << 20))
    };
    if sign == 1 { -mag } else { mag }
}

/// The largest finite e4m3 value's code (448), without sign.
pub const E4M3_MAX_CODE: u8 = 0x7e;

/// One rank's input tokens in the three forms the kernels use.
#[derive(Debug, Clone)]
pub struct RankTokens {
    pub num_tokens: usize,
    pub hidden: usize,
    /// [token][hidden] e4m3 codes (normal-mode FP8 dispatch input; what LL must produce).
    pub fp8: Vec<u8>,
    /// [token][hidden / 128] dequantisation factors (DeepEP's `x_scales`): `2^s`.
    pub scales: Vec<f32>,
    /// [token][hidden] bf16 = e4m3 value × scale (LL input, BF16 dispatch input).
    pub bf16: Vec<u16>,
}

impl RankTokens {
    pub fn fp8_row(&self, t: usize) -> &[u8] {
        &self.fp8[t * self.hidden..(t + 1) * self.hidden]
    }
    pub fn scales_row(&self, t: usize) -> &[f32] {
        let s = self.hidden / 128;
        &self.scales[t * s..(t + 1) * s]
    }
    pub fn bf16_row(&self, t: usize) -> &[u16] {
        &self.bf16[t * self.hidden..(t + 1) * self.hidden]
    }
    /// The exact value of element `h` of token `t`.
    pub fn value(&self, t: usize, h: usize) -> f32 {
        bf16_to_f32(self.bf16[t * self.hidden + h])
    }
}

/// Every rank's tokens of a job of `ranks` ranks with workload `w`, generated in parallel.
pub fn generate_ranks(w: &eptwin_engine::api::Workload, ranks: u32) -> Vec<RankTokens> {
    use rayon::prelude::*;
    (0..ranks)
        .into_par_iter()
        .map(|r| generate(w.seed, r, w.tokens_per_rank as usize, w.hidden as usize))
        .collect()
}

/// Generate one rank's tokens; `hidden` must be a multiple of 128.
pub fn generate(seed: u64, rank: u32, num_tokens: usize, hidden: usize) -> RankTokens {
    assert!(hidden.is_multiple_of(128), "hidden must be a multiple of 128");
    // One SplitMix64 stream per (seed, rank): the engine's frozen generator, not its routing
    // streams, so test data never correlates with routing.
    let mut state = seed ^ (0xe9_7a1c_0000_0000 | rank as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
    let mut next_u64 = || splitmix64(&mut state);
    let blocks = hidden / 128;
    let mut fp8 = vec![0u8; num_tokens * hidden];
    let mut scales = vec![0f32; num_tokens * blocks];
    let mut bf16 = vec![0u16; num_tokens * hidden];
    for t in 0..num_tokens {
        for b in 0..blocks {
            let r = next_u64();
            let shift = (r % 7) as i32 - 3;
            let scale = 2f32.powi(shift);
            scales[t * blocks + b] = scale;
            let amax_at = (t * 7 + b * 13 + (r >> 8) as usize) % 128;
            let mut bits = 0u64;
            for i in 0..128 {
                if i % 8 == 0 {
                    bits = next_u64();
                }
                let raw = (bits >> ((i % 8) * 8)) as u8;
                let sign = raw & 0x80;
                // Codes 1..=0x7e: no zero, no NaN (0x7f).
                let mag = if i == amax_at { E4M3_MAX_CODE } else { 1 + (raw & 0x7f) % 0x7e };
                let code = sign | mag;
                let idx = t * hidden + b * 128 + i;
                fp8[idx] = code;
                bf16[idx] = f32_to_bf16(e4m3_to_f32(code) * scale);
            }
        }
    }
    RankTokens { num_tokens, hidden, fp8, scales, bf16 }
}

/// The stand-in expert's multiplier for a rank (normal mode) or a global expert (LL mode).
pub fn expert_factor(id: u32) -> f32 {
    (8 + id % 7) as f32 / 8.0
}

/// Expert output element: bf16(x · factor), as `expert_value` in testdata.cu.
pub fn expert_output(x: f32, factor: f32) -> u16 {
    f32_to_bf16(x * factor)
}

/// The bytes of bf16 codes in memory order (what the kernels read and write).
pub fn bytes_of_u16(v: &[u16]) -> &[u8] {
    // SAFETY: u16 has no padding; the byte view covers the same memory.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// DeepEP's `calc_diff`: 1 - 2·Σxy / Σ(x² + y²), in f64.
pub fn calc_diff(a: &[f32], b: &[f32]) -> f64 {
    let (mut xy, mut sq) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64 + 1.0, y as f64 + 1.0);
        xy += x * y;
        sq += x * x + y * y;
    }
    if sq == 0.0 { 0.0 } else { 1.0 - 2.0 * xy / sq }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Round to nearest even into e4m3 with saturation (what `cvt.rn.satfinite.e4m3x2.f32`
    /// does), by search over the 254 finite codes: slow but obviously right.
    fn f32_to_e4m3_reference(f: f32) -> u8 {
        let mut best = 0u8;
        let mut best_err = f32::INFINITY;
        for code in 0..=255u8 {
            if code & 0x7f == 0x7f {
                continue;
            }
            let v = e4m3_to_f32(code);
            let err = (v - f).abs();
            let tie_even = err == best_err && code & 1 == 0;
            if err < best_err || tie_even {
                best = code;
                best_err = err;
            }
        }
        best
    }

    #[test]
    fn e4m3_decoding() {
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0xfe), -448.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x01), 0.001953125);
        assert_eq!(e4m3_to_f32(0x08), 0.015625);
    }

    /// `f32_to_bf16` in common.cuh: add 0x7fff plus the lowest kept bit, truncate.
    fn f32_to_bf16_as_the_kernels_do(f: f32) -> u16 {
        let u = f.to_bits();
        (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
    }

    proptest::proptest! {
        #![proptest_config(eptwin_engine::testing::proptest_config(256))]
        /// The crate's conversion and the kernels' agree on every finite value, ties included.
        #[test]
        fn bf16_conversion_matches_the_kernels(bits in proptest::prelude::any::<u32>()) {
            let f = f32::from_bits(bits);
            proptest::prop_assume!(f.is_finite());
            proptest::prop_assert_eq!(f32_to_bf16(f), f32_to_bf16_as_the_kernels_do(f));
            let h = f32_to_bf16(f);
            proptest::prop_assert_eq!(bf16_to_f32(h).to_bits(), (h as u32) << 16);
        }
    }

    #[test]
    fn bf16_rounding() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even wins.
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
    }

    #[test]
    fn generated_tokens_survive_every_conversion_exactly() {
        let d = generate(7, 3, 4, 512);
        for t in 0..4 {
            for b in 0..4 {
                let block: Vec<f32> = (0..128).map(|i| d.value(t, b * 128 + i)).collect();
                let amax = block.iter().fold(0f32, |a, &v| a.max(v.abs()));
                let scale = 448.0 / amax;
                assert_eq!(amax / 448.0, d.scales_row(t)[b], "scale-inverse is exact");
                for (i, &v) in block.iter().enumerate() {
                    let code = d.fp8_row(t)[b * 128 + i];
                    assert_ne!(code & 0x7f, 0, "no zeros");
                    assert_eq!(f32_to_e4m3_reference(v * scale), code, "FP8 cast is exact");
                    for j in 0..7 {
                        let out = expert_output(v, expert_factor(j));
                        assert_eq!(bf16_to_f32(out), v * expert_factor(j), "expert output exact");
                    }
                }
            }
        }
    }

    /// The tokens are a function of (seed, rank) only, frozen: the kernels' outputs are checked
    /// against them and committed results were measured with them.
    #[test]
    fn generated_tokens_are_frozen() {
        use sha2::{Digest, Sha256};
        let d = generate(1, 3, 5, 256);
        let mut h = Sha256::new();
        h.update(&d.fp8);
        for s in &d.scales {
            h.update(s.to_bits().to_le_bytes());
        }
        h.update(bytes_of_u16(&d.bf16));
        let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(&d.fp8[..4], [254, 165, 72, 154]);
        assert_eq!(hex, "5d10d82214893a1f2676333afea4e5c7c3e46c9d776e97c442181821c262d8e1");
    }

    #[test]
    fn ranks_get_different_tokens() {
        assert_ne!(generate(1, 0, 2, 128).fp8, generate(1, 1, 2, 128).fp8);
        assert_eq!(generate(1, 0, 2, 128).fp8, generate(1, 0, 2, 128).fp8);
    }

    #[test]
    fn calc_diff_is_zero_for_equal() {
        assert_eq!(calc_diff(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!(calc_diff(&[1.0, 2.0], &[1.0, 3.0]) > 0.0);
    }
}
