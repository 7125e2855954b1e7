//! Fabric QoS settings in OpenSM terms (fabric.md §1, §4), parsed and checked: SL→VL table,
//! VL arbitration tables, high limit; and the RoCE equivalents (fabric.md §5).

use serde::{Deserialize, Serialize};

use crate::ids::{Sl, Vl};
use crate::profile::FabricParams;
use crate::scenario::schema::FabricKind;

/// VL15 is management-only; an SL mapped to it is dropped (fabric.md §1).
pub const VL15: u8 = 15;
pub const VALID_DATA_VLS: [u8; 5] = [1, 2, 4, 8, 15];
pub const VALID_MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];
/// OpenSM: VLArbHighCap / VLArbLowCap ≤ 64 entries.
pub const MAX_VLARB_ENTRIES: usize = 64;
/// `high_limit = 255` means unbounded (low priority can starve).
pub const HIGH_LIMIT_UNBOUNDED: u8 = 255;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VlArbEntry {
    pub vl: Vl,
    /// Units of 64 bytes; 0 = entry skipped.
    pub weight: u8,
}

/// Parse OpenSM's `vl:weight,vl:weight` syntax (`qos_vlarb_high` / `qos_vlarb_low`).
pub fn parse_vlarb(text: &str) -> Result<Vec<VlArbEntry>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let mut entries = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        let (vl, weight) = part.split_once(':').ok_or_else(|| {
            format!("entry {part:?} is not VL:weight (OpenSM syntax, e.g. \"0:64,1:128\")")
        })?;
        let vl: u8 =
            vl.trim().parse().map_err(|_| format!("VL {vl:?} in {part:?} is not 0..=14"))?;
        if vl >= VL15 {
            return Err(format!(
                "VL {vl} in {part:?}: VL15 is management only and never arbitrated; data VLs are 0..=14"
            ));
        }
        let weight: u32 = weight
            .trim()
            .parse()
            .map_err(|_| format!("weight {weight:?} in {part:?} is not a number 0..=255"))?;
        if weight > 255 {
            return Err(format!("weight {weight} in {part:?} exceeds 255 (units of 64 bytes)"));
        }
        entries.push(VlArbEntry { vl: Vl(vl), weight: weight as u8 });
    }
    if entries.len() > MAX_VLARB_ENTRIES {
        return Err(format!(
            "{} entries: VL arbitration tables hold at most {MAX_VLARB_ENTRIES}",
            entries.len()
        ));
    }
    Ok(entries)
}

/// The lane a job's packets travel on at every port: on InfiniBand the VL its SL maps to
/// (`sl2vl`), on RoCE the Ethernet priority (0..=7) that `NVSHMEM_IB_SL` selects: the SL's
/// low three bits (the validator rejects an SL above 7 on RoCE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Lane {
    Vl(Vl),
    Priority(u8),
}

impl Lane {
    /// The lane's index at a port: the VL or the priority.
    pub fn index(self) -> u8 {
        match self {
            Lane::Vl(vl) => vl.0,
            Lane::Priority(p) => p,
        }
    }

    /// The VL, on InfiniBand.
    pub fn vl(self) -> Option<Vl> {
        match self {
            Lane::Vl(vl) => Some(vl),
            Lane::Priority(_) => None,
        }
    }
}

/// The QoS configuration every port of the fabric model uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FabricQos {
    pub kind: FabricKind,
    pub mtu: u32,
    pub data_vls: u8,
    /// Index = SL; value = VL (VL15 = dropped).
    pub sl2vl: [Vl; 16],
    pub vlarb_high: Vec<VlArbEntry>,
    pub vlarb_low: Vec<VlArbEntry>,
    pub high_limit: u8,
    /// RoCE: ETS percent per traffic class (priority p ↦ TC p), strict classes, PFC enables.
    pub ets_tc_bw: [u8; 8],
    pub strict_tcs: Vec<u8>,
    pub pfc: [bool; 8],
}

impl FabricQos {
    /// Build from the resolved profile; `Err` carries (fabric key, message) pairs.
    pub fn from_params(p: &FabricParams) -> Result<Self, Vec<(String, String)>> {
        let mut errors = Vec::new();
        if !VALID_MTUS.contains(&p.mtu) {
            errors.push((
                "mtu".into(),
                format!(
                    "MTU {} is not an IB MTU; expected one of 256, 512, 1024, 2048, 4096",
                    p.mtu
                ),
            ));
        }
        if !VALID_DATA_VLS.contains(&p.data_vls) {
            errors.push((
                "data_vls".into(),
                format!("{} data VLs: PortInfo.VLCap allows 1, 2, 4, 8 or 15", p.data_vls),
            ));
        }
        let mut sl2vl = [Vl(0); 16];
        if p.sl2vl.len() != 16 {
            errors.push((
                "sl2vl".into(),
                format!("{} entries: sl2vl needs exactly 16 (one per SL)", p.sl2vl.len()),
            ));
        }
        for (sl, &vl) in p.sl2vl.iter().enumerate().take(16) {
            if vl != VL15 && vl >= p.data_vls {
                errors.push((
                    format!("sl2vl[{sl}]"),
                    format!(
                        "SL{sl} maps to VL{vl}, but only VL0..VL{} are operational (data_vls = {})",
                        p.data_vls.saturating_sub(1),
                        p.data_vls
                    ),
                ));
            }
            sl2vl[sl] = Vl(vl);
        }
        let mut table = |key: &str, text: &str| match parse_vlarb(text) {
            Ok(entries) => {
                for e in &entries {
                    if e.vl.0 >= p.data_vls {
                        errors.push((
                            key.into(),
                            format!("VL{} is not operational (data_vls = {})", e.vl.0, p.data_vls),
                        ));
                    }
                }
                entries
            }
            Err(message) => {
                errors.push((key.into(), message));
                Vec::new()
            }
        };
        let vlarb_high = table("vlarb_high", &p.vlarb_high);
        let vlarb_low = table("vlarb_low", &p.vlarb_low);

        let mut ets_tc_bw = [0u8; 8];
        let mut pfc = [false; 8];
        if p.kind == FabricKind::Roce {
            match &p.ets_tc_bw {
                Some(shares) if shares.len() == 8 => {
                    let sum: u32 = shares.iter().map(|&s| s as u32).sum();
                    if sum != 100 {
                        errors.push((
                            "ets_tc_bw".into(),
                            format!("ETS shares sum to {sum}%, expected 100"),
                        ));
                    }
                    ets_tc_bw.copy_from_slice(shares);
                }
                Some(shares) => errors.push((
                    "ets_tc_bw".into(),
                    format!("{} entries: ETS needs one share per traffic class (8)", shares.len()),
                )),
                None => ets_tc_bw = [100, 0, 0, 0, 0, 0, 0, 0],
            }
            if let Some(enables) = &p.pfc {
                if enables.len() != 8 || enables.iter().any(|&v| v > 1) {
                    errors.push((
                        "pfc".into(),
                        "pfc needs 8 entries of 0 or 1 (one per priority)".into(),
                    ));
                } else {
                    for (i, &v) in enables.iter().enumerate() {
                        pfc[i] = v == 1;
                    }
                }
            } else {
                pfc = [true; 8];
            }
        }
        let strict_tcs = p.strict_tcs.clone().unwrap_or_default();
        if let Some(bad) = strict_tcs.iter().find(|&&tc| tc > 7) {
            errors
                .push(("strict_tcs".into(), format!("traffic class {bad} does not exist (0..=7)")));
        }
        if errors.is_empty() {
            Ok(FabricQos {
                kind: p.kind,
                mtu: p.mtu,
                data_vls: p.data_vls,
                sl2vl,
                vlarb_high,
                vlarb_low,
                high_limit: p.high_limit,
                ets_tc_bw,
                strict_tcs,
                pfc,
            })
        } else {
            Err(errors)
        }
    }

    /// The VL an SL's packets travel on, `None` when the SL maps to VL15 (dropped).
    pub fn vl_of(&self, sl: Sl) -> Option<Vl> {
        let vl = self.sl2vl[sl.index() & 15];
        (vl.0 != VL15).then_some(vl)
    }

    /// The lane an SL's packets travel on; `None` on InfiniBand when the SL maps to VL15.
    pub fn lane_of(&self, sl: Sl) -> Option<Lane> {
        match self.kind {
            FabricKind::Infiniband => self.vl_of(sl).map(Lane::Vl),
            FabricKind::Roce => Some(Lane::Priority(sl.0 & 7)),
        }
    }

    /// Whether the arbiter ever schedules this VL (an entry with weight > 0 in either table).
    pub fn vl_is_scheduled(&self, vl: Vl) -> bool {
        self.vlarb_high.iter().chain(&self.vlarb_low).any(|e| e.vl == vl && e.weight > 0)
    }

    pub fn vl_is_high_priority(&self, vl: Vl) -> bool {
        self.vlarb_high.iter().any(|e| e.vl == vl && e.weight > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_opensm_tables() {
        let t = parse_vlarb("0:0,1:64, 2:128,3:192").unwrap();
        assert_eq!(t.len(), 4);
        assert_eq!(t[2], VlArbEntry { vl: Vl(2), weight: 128 });
        assert!(parse_vlarb("0:256").is_err());
        assert!(parse_vlarb("15:4").is_err());
        assert!(parse_vlarb("1-4").is_err());
        assert!(parse_vlarb("").unwrap().is_empty());
    }
}
