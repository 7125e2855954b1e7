//! The process environment exactly as DeepEP V1's `Buffer.__init__` leaves it
//! (`deep_ep/buffer.py:103-132`, deepep.md §4), and the NVSHMEM values the models read from it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::config::EpMode;
use crate::scenario::schema::BufferSpec;

/// Where a variable's final value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EnvOrigin {
    /// The user's value; DeepEP does not touch this variable.
    User,
    /// Written by DeepEP (a user value, if any, was overwritten).
    DeepEp,
    /// DeepEP writes it only when unset, and the user had set it (`NVSHMEM_QP_DEPTH`).
    UserKeptByDeepEp,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvVar {
    pub value: String,
    pub origin: EnvOrigin,
    /// The DeepEP source line that writes it, for `eptwin env --explain`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// A user value DeepEP overwrote.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overwritten: Option<String>,
}

/// `NVSHMEM_QP_DEPTH` default and the range NVSHMEM accepts (fabric.md §6).
pub const DEFAULT_QP_DEPTH: u32 = 1024;
pub const MIN_QP_DEPTH: u32 = 128;
pub const MAX_QP_DEPTH: u32 = 32768;
/// `NVSHMEM_CUMEM_GRANULARITY` as DeepEP writes it: 2^29 (buffer.py:122).
pub const CUMEM_GRANULARITY: u64 = 1 << 29;

/// The final environment of one job: user variables plus DeepEP's writes.
pub fn effective_env(
    user: &BTreeMap<String, String>,
    buffer: Option<&BufferSpec>,
    mode: Option<EpMode>,
) -> BTreeMap<String, EnvVar> {
    let mut env: BTreeMap<String, EnvVar> = user
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                EnvVar {
                    value: v.clone(),
                    origin: EnvOrigin::User,
                    source: None,
                    overwritten: None,
                },
            )
        })
        .collect();
    let (Some(buffer), Some(mode)) = (buffer, mode) else { return env };
    // buffer.py:105: only `if self.runtime.get_num_rdma_ranks() > 1 or low_latency_mode`.
    if !mode.uses_nvshmem() {
        return env;
    }
    let mut write = |name: &str, value: String, line: &str| {
        let overwritten = user.get(name).filter(|old| **old != value).cloned();
        env.insert(
            name.to_string(),
            EnvVar {
                value,
                origin: EnvOrigin::DeepEp,
                source: Some(format!("deep_ep/buffer.py:{line}")),
                overwritten,
            },
        );
    };
    let p2p = if buffer.allow_nvlink_for_low_latency_mode { "0" } else { "1" };
    write("NVSHMEM_DISABLE_P2P", p2p.into(), "108");
    write("NVSHMEM_IB_ENABLE_IBGDA", "1".into(), "109");
    write("NVSHMEM_IBGDA_NUM_RC_PER_PE", buffer.num_qps_per_rank.to_string(), "110");
    write("NVSHMEM_MAX_TEAMS", "7".into(), "118");
    write("NVSHMEM_DISABLE_NVLS", "1".into(), "120");
    write("NVSHMEM_CUMEM_GRANULARITY", CUMEM_GRANULARITY.to_string(), "122");
    if !buffer.allow_mnnvl {
        write("NVSHMEM_DISABLE_MNNVL", "1".into(), "124-126");
    }
    // buffer.py:113-114: `os.environ['NVSHMEM_QP_DEPTH'] = os.environ.get('NVSHMEM_QP_DEPTH', '1024')`.
    match user.get("NVSHMEM_QP_DEPTH") {
        Some(v) => {
            env.insert(
                "NVSHMEM_QP_DEPTH".into(),
                EnvVar {
                    value: v.clone(),
                    origin: EnvOrigin::UserKeptByDeepEp,
                    source: Some("deep_ep/buffer.py:113-114".into()),
                    overwritten: None,
                },
            );
        }
        None => write("NVSHMEM_QP_DEPTH", DEFAULT_QP_DEPTH.to_string(), "113-114"),
    }
    env
}

/// Values NVSHMEM reads from the environment at initialisation, as the models use them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvshmemSettings {
    /// `NVSHMEM_IB_SL` (default 0): SL of every QP of the job (the Ethernet priority on RoCE).
    pub ib_sl: u8,
    /// `NVSHMEM_IB_TRAFFIC_CLASS` (default 0).
    pub traffic_class: u8,
    /// Effective WQ depth: rounded up to a power of two, clamped to [128, 32768].
    pub qp_depth: u32,
    /// `NVSHMEM_DISABLE_P2P`: peers reached over NVLink use RDMA instead.
    pub disable_p2p: bool,
    /// `NVSHMEM_DISABLE_MNNVL`: cross-node NVLink peers use RDMA.
    pub disable_mnnvl: bool,
    /// `NVSHMEM_IBGDA_NUM_RC_PER_PE` (NVSHMEM default 2).
    pub num_rc_per_pe: u32,
}

/// Parse an integer environment value the way NVSHMEM does (decimal).
pub fn parse_env_u64(value: &str) -> Option<u64> {
    value.trim().parse().ok()
}

fn parse_bool(value: &str) -> bool {
    matches!(value.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "y" | "on")
}

/// `NVSHMEM_QP_DEPTH` as NVSHMEM applies it (fabric.md §6: power of 2 in [128, 32768]).
pub fn effective_qp_depth(requested: u64) -> u32 {
    let clamped = requested.clamp(MIN_QP_DEPTH as u64, MAX_QP_DEPTH as u64);
    clamped.next_power_of_two() as u32
}

impl NvshmemSettings {
    /// Read from a final environment; malformed values fall back to NVSHMEM defaults (the
    /// validator reports them).
    pub fn from_env(env: &BTreeMap<String, EnvVar>) -> Self {
        let get = |k: &str| env.get(k).map(|v| v.value.as_str());
        NvshmemSettings {
            ib_sl: get("NVSHMEM_IB_SL").and_then(parse_env_u64).filter(|&v| v <= 15).unwrap_or(0)
                as u8,
            traffic_class: get("NVSHMEM_IB_TRAFFIC_CLASS")
                .and_then(parse_env_u64)
                .filter(|&v| v <= 255)
                .unwrap_or(0) as u8,
            qp_depth: effective_qp_depth(
                get("NVSHMEM_QP_DEPTH").and_then(parse_env_u64).unwrap_or(DEFAULT_QP_DEPTH as u64),
            ),
            disable_p2p: get("NVSHMEM_DISABLE_P2P").is_some_and(parse_bool),
            disable_mnnvl: get("NVSHMEM_DISABLE_MNNVL").is_some_and(parse_bool),
            num_rc_per_pe: get("NVSHMEM_IBGDA_NUM_RC_PER_PE")
                .and_then(parse_env_u64)
                .map_or(2, |v| v as u32),
        }
    }
}

/// Quote a value for a POSIX shell only when it needs it.
pub fn shell_quote(value: &str) -> String {
    let plain = !value.is_empty()
        && value.chars().all(|c| c.is_ascii_alphanumeric() || "_-./:,=+@%".contains(c));
    if plain { value.to_string() } else { format!("'{}'", value.replace('\'', "'\\''")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer(text: &str) -> BufferSpec {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn intranode_normal_writes_nothing() {
        let user = BTreeMap::from([("NVSHMEM_IB_SL".to_string(), "3".to_string())]);
        let env = effective_env(&user, Some(&buffer("")), Some(EpMode::Intranode));
        assert_eq!(env.len(), 1);
        assert_eq!(env["NVSHMEM_IB_SL"].origin, EnvOrigin::User);
    }

    #[test]
    fn low_latency_writes_deepep_variables() {
        let user = BTreeMap::from([
            ("NVSHMEM_QP_DEPTH".to_string(), "2048".to_string()),
            ("NVSHMEM_DISABLE_P2P".to_string(), "0".to_string()),
            ("NVSHMEM_IB_SL".to_string(), "1".to_string()),
        ]);
        let b = buffer(
            "low_latency_mode = true\nnum_qps_per_rank = 16\nallow_nvlink_for_low_latency_mode = false",
        );
        let env = effective_env(&user, Some(&b), Some(EpMode::LowLatency));
        assert_eq!(env["NVSHMEM_DISABLE_P2P"].value, "1");
        assert_eq!(env["NVSHMEM_DISABLE_P2P"].overwritten.as_deref(), Some("0"));
        assert_eq!(env["NVSHMEM_IBGDA_NUM_RC_PER_PE"].value, "16");
        assert_eq!(env["NVSHMEM_QP_DEPTH"].value, "2048");
        assert_eq!(env["NVSHMEM_QP_DEPTH"].origin, EnvOrigin::UserKeptByDeepEp);
        assert_eq!(env["NVSHMEM_DISABLE_MNNVL"].value, "1");
        assert_eq!(env["NVSHMEM_IB_SL"].origin, EnvOrigin::User);
        assert_eq!(env["NVSHMEM_CUMEM_GRANULARITY"].value, "536870912");
        let mnnvl = buffer("low_latency_mode = true\nallow_mnnvl = true");
        let env = effective_env(&BTreeMap::new(), Some(&mnnvl), Some(EpMode::LowLatency));
        assert!(!env.contains_key("NVSHMEM_DISABLE_MNNVL"));
        assert_eq!(env["NVSHMEM_QP_DEPTH"].value, "1024");
        let s = NvshmemSettings::from_env(&env);
        assert_eq!((s.qp_depth, s.num_rc_per_pe, s.disable_p2p, s.ib_sl), (1024, 24, false, 0));
    }

    #[test]
    fn qp_depth_rounding() {
        assert_eq!(effective_qp_depth(1000), 1024);
        assert_eq!(effective_qp_depth(16), 128);
        assert_eq!(effective_qp_depth(100_000), 32768);
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("1024"), "1024");
    }
}
