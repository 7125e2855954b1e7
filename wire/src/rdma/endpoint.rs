//! What two peers exchange out of band before their RC QPs can talk: per QP its number, LID,
//! GID and starting PSN, and the registered regions the other side may write into. A small
//! versioned little-endian encoding, so any byte channel (a socket, a file, a launcher's
//! key-value store) carries it.

use crate::error::WireError;

/// One QP's address, as the remote side needs it to move its QP to RTR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpEndpoint {
    pub qp_num: u32,
    /// 0 on RoCE.
    pub lid: u16,
    /// The GID the QP sends from (network order); routing on RoCE.
    pub gid: [u8; 16],
    /// First packet sequence number this QP sends (24 bits).
    pub psn: u32,
}

/// A registered region a peer may write to and run atomics on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteRegion {
    pub addr: u64,
    pub len_bytes: u64,
    pub rkey: u32,
}

impl RemoteRegion {
    /// `offset..offset+len` inside the region, or why not.
    pub fn check(&self, offset: u64, len_bytes: u64) -> Result<u64, (u64, u64, u64)> {
        match offset.checked_add(len_bytes) {
            Some(end) if end <= self.len_bytes => Ok(self.addr + offset),
            _ => Err((offset, len_bytes, self.len_bytes)),
        }
    }
}

/// Everything one side sends the other for one peer connection.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeerInfo {
    pub qps: Vec<QpEndpoint>,
    pub regions: Vec<RemoteRegion>,
}

const MAGIC: &[u8; 4] = b"EPQP";
const VERSION: u8 = 1;
const QP_BYTES: usize = 4 + 2 + 16 + 4;
const REGION_BYTES: usize = 8 + 8 + 4;

impl PeerInfo {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(9 + self.qps.len() * QP_BYTES + self.regions.len() * REGION_BYTES);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&(self.qps.len() as u16).to_le_bytes());
        out.extend_from_slice(&(self.regions.len() as u16).to_le_bytes());
        for q in &self.qps {
            out.extend_from_slice(&q.qp_num.to_le_bytes());
            out.extend_from_slice(&q.lid.to_le_bytes());
            out.extend_from_slice(&q.gid);
            out.extend_from_slice(&q.psn.to_le_bytes());
        }
        for r in &self.regions {
            out.extend_from_slice(&r.addr.to_le_bytes());
            out.extend_from_slice(&r.len_bytes.to_le_bytes());
            out.extend_from_slice(&r.rkey.to_le_bytes());
        }
        out
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, WireError> {
        let bad = |why: String| WireError::Endpoint(why);
        if bytes.len() < 9 || &bytes[..4] != MAGIC {
            return Err(bad(format!("{} bytes without the EPQP header", bytes.len())));
        }
        if bytes[4] != VERSION {
            return Err(bad(format!("version {} (this build reads {VERSION})", bytes[4])));
        }
        let nq = u16::from_le_bytes([bytes[5], bytes[6]]) as usize;
        let nr = u16::from_le_bytes([bytes[7], bytes[8]]) as usize;
        let want = 9 + nq * QP_BYTES + nr * REGION_BYTES;
        if bytes.len() != want {
            return Err(bad(format!(
                "{} bytes for {nq} QPs and {nr} regions (expected {want})",
                bytes.len()
            )));
        }
        let mut at = 9;
        let mut take = |n: usize| {
            let s = &bytes[at..at + n];
            at += n;
            s
        };
        let u32_of = |s: &[u8]| u32::from_le_bytes(s.try_into().expect("4 bytes"));
        let u64_of = |s: &[u8]| u64::from_le_bytes(s.try_into().expect("8 bytes"));
        let mut info = PeerInfo::default();
        for _ in 0..nq {
            let qp_num = u32_of(take(4));
            let lid = u16::from_le_bytes(take(2).try_into().expect("2 bytes"));
            let gid: [u8; 16] = take(16).try_into().expect("16 bytes");
            let psn = u32_of(take(4));
            if psn > 0xff_ffff {
                return Err(bad(format!("QP {qp_num:#x}: PSN {psn:#x} exceeds 24 bits")));
            }
            info.qps.push(QpEndpoint { qp_num, lid, gid, psn });
        }
        for _ in 0..nr {
            let addr = u64_of(take(8));
            let len_bytes = u64_of(take(8));
            let rkey = u32_of(take(4));
            info.regions.push(RemoteRegion { addr, len_bytes, rkey });
        }
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn endpoint() -> impl Strategy<Value = QpEndpoint> {
        (any::<u32>(), any::<u16>(), any::<[u8; 16]>(), 0u32..=0xff_ffff)
            .prop_map(|(qp_num, lid, gid, psn)| QpEndpoint { qp_num, lid, gid, psn })
    }

    fn region() -> impl Strategy<Value = RemoteRegion> {
        (any::<u64>(), any::<u64>(), any::<u32>())
            .prop_map(|(addr, len_bytes, rkey)| RemoteRegion { addr, len_bytes, rkey })
    }

    proptest! {
        #![proptest_config(eptwin_engine::testing::proptest_config(256))]
        #[test]
        fn peer_info_round_trips(qps in prop::collection::vec(endpoint(), 0..40),
                                 regions in prop::collection::vec(region(), 0..8)) {
            let info = PeerInfo { qps, regions };
            prop_assert_eq!(PeerInfo::from_bytes(&info.to_bytes()).unwrap(), info);
        }

        #[test]
        fn truncated_or_extended_data_is_rejected(qps in prop::collection::vec(endpoint(), 1..5),
                                                  cut in 1usize..20) {
            let bytes = PeerInfo { qps, regions: vec![] }.to_bytes();
            let short = &bytes[..bytes.len().saturating_sub(cut)];
            prop_assert!(PeerInfo::from_bytes(short).is_err());
            let mut long = bytes.clone();
            long.extend(std::iter::repeat_n(0u8, cut));
            prop_assert!(PeerInfo::from_bytes(&long).is_err());
        }
    }

    #[test]
    fn remote_range_check() {
        let r = RemoteRegion { addr: 0x1000, len_bytes: 64, rkey: 1 };
        assert_eq!(r.check(0, 64), Ok(0x1000));
        assert_eq!(r.check(60, 4), Ok(0x103c));
        assert!(r.check(60, 5).is_err());
        assert!(r.check(u64::MAX, 2).is_err());
    }

    #[test]
    fn wrong_magic_is_a_clear_error() {
        let e = PeerInfo::from_bytes(b"hello world").unwrap_err().to_string();
        assert!(e.contains("EPQP"), "{e}");
    }
}
