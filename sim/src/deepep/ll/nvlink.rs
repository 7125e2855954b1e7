//! What DeepEP's warp-wide stores of a low-latency message cost an NVLink port.

/// Bytes one warp-wide 16-byte store covers (32 lanes): how DeepEP's dispatch writes a message
/// to an NVLink peer (`UNROLLED_WARP_COPY` with `st_na_global`).
pub(super) const WARP_STORE_BYTES: u64 = 32 * 16;
/// What a message of `bytes` written by warp-wide stores at byte `base` of the peer's buffer
/// costs an NVLink port, in payload bytes at its rate. An SM store travels as packets of at most
/// `nvlink.packet_payload_bytes` (128 B, docs/design.md fabric §7), one per line it touches, and
/// a packet that carries only part of its line takes the link as a whole one; so a message that
/// starts off a line boundary (DeepEP's 7,408-byte dispatch messages sit back to back, every
/// warp store of 512 B then touches five lines) costs more than its bytes. Whole lines cost their
/// bytes: the efficiency the link's rate carries was measured on such stores.
pub fn nvlink_store_bytes(base: u64, bytes: u64, params: &crate::params::Params) -> u64 {
    let line = params.profile.nvlink.packet_payload_bytes.max(1) as u64;
    let mut packets = 0;
    let mut at = 0;
    while at < bytes {
        let len = WARP_STORE_BYTES.min(bytes - at);
        packets += (base + at + len - 1) / line - (base + at) / line + 1;
        at += len;
    }
    // A message that starts on a line costs its bytes (its last packet is as partial as ever).
    let aligned = bytes.div_ceil(line);
    bytes + packets.saturating_sub(aligned) * line
}
