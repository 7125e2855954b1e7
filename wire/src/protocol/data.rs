//! The bytes the host reference moves, predictable on every side: a token's payload and scales
//! are a pure function of (call, source rank, token); an expert's output row is small integers
//! in BF16, so the sums the receivers form are exact and every received byte and every
//! combined row can be checked bit for bit.

use eptwin_engine::api::splitmix64;

use super::geometry::TokenDtype;

/// Fill `out` with bytes determined by `key` (splitmix64 over a mixed seed).
pub fn fill(out: &mut [u8], key: [u64; 4]) {
    let mut state = key.iter().fold(0x9E37_79B9_7F4A_7C15u64, |s, &k| {
        let mut s = s ^ k;
        splitmix64(&mut s)
    });
    for chunk in out.chunks_mut(8) {
        let word = splitmix64(&mut state).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// Payload then scales of `token` of `rank` in call `call` (`dtype.payload_bytes +
/// dtype.scale_bytes` bytes).
pub fn token_bytes(call: u32, rank: u32, token: u32, dtype: TokenDtype, hidden: u32) -> Vec<u8> {
    let n = dtype.payload_bytes(hidden) + dtype.scale_bytes(hidden);
    let mut out = vec![0u8; n as usize];
    fill(&mut out, [1, call as u64, rank as u64, token as u64]);
    out
}

/// BF16 bits of a small integer (exact: its f32 has no low mantissa bits).
pub fn bf16_bits(v: f32) -> u16 {
    debug_assert_eq!(v.to_bits() & 0xffff, 0, "{v} is not exact in BF16");
    (v.to_bits() >> 16) as u16
}

pub fn bf16_value(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Element `i` of the normal-kernel expert output of `token` (from `src_rank`) computed on
/// `expert_rank`: an integer in 0..=4, so a node's partial (≤ 32 ranks) and the sum over
/// nodes stay exact in BF16 and f32.
pub fn normal_expert_value(call: u32, src_rank: u32, token: u32, expert_rank: u32, i: u32) -> f32 {
    ((call * 3 + src_rank * 31 + token * 17 + expert_rank * 7 + i) % 5) as f32
}

/// Element `i` of the low-latency output row of `expert` for `token` of `src_rank`: an
/// integer in -3..=3.
pub fn ll_expert_value(call: u32, src_rank: u32, token: u32, expert: u32, i: u32) -> f32 {
    ((call + src_rank * 13 + token * 7 + expert * 3 + i) % 7) as f32 - 3.0
}

/// A BF16 row of `hidden` elements, little-endian.
pub fn bf16_row(hidden: u32, value: impl Fn(u32) -> f32) -> Vec<u8> {
    (0..hidden).flat_map(|i| bf16_bits(value(i)).to_le_bytes()).collect()
}

/// The f32 values of a little-endian BF16 row.
pub fn row_values(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(2).map(|b| bf16_value(u16::from_le_bytes([b[0], b[1]]))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_differ_by_every_key_part_and_repeat_exactly() {
        let a = token_bytes(0, 1, 2, TokenDtype::Fp8, 256);
        assert_eq!(a.len(), 256 + 8);
        assert_eq!(a, token_bytes(0, 1, 2, TokenDtype::Fp8, 256));
        for other in [
            token_bytes(1, 1, 2, TokenDtype::Fp8, 256),
            token_bytes(0, 2, 2, TokenDtype::Fp8, 256),
            token_bytes(0, 1, 3, TokenDtype::Fp8, 256),
        ] {
            assert_ne!(a, other);
        }
        assert_eq!(token_bytes(0, 1, 2, TokenDtype::Bf16, 100).len(), 200);
    }

    #[test]
    fn small_integers_survive_bf16() {
        for v in -3..=40 {
            assert_eq!(bf16_value(bf16_bits(v as f32)), v as f32);
        }
        let row = bf16_row(4, |i| i as f32 - 1.0);
        assert_eq!(row_values(&row), vec![-1.0, 0.0, 1.0, 2.0]);
    }
}
