//! The process environment exactly as DeepEP V1's `Buffer.__init__` leaves it
//! (`deep_ep/buffer.py:103-132`, docs/design.md, DeepEP §4), and the NVSHMEM values the models read
//! from it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::config::EpMode;
use crate::deepep::buffer::BufferSettings;

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

/// `NVSHMEM_QP_DEPTH` default and the range NVSHMEM accepts (docs/design.md, fabric §6).
pub const DEFAULT_QP_DEPTH: u32 = 1024;
pub const MIN_QP_DEPTH: u32 = 128;
pub const MAX_QP_DEPTH: u32 = 32768;
/// `NVSHMEM_CUMEM_GRANULARITY` as DeepEP writes it: 2^29 (buffer.py:122).
pub const CUMEM_GRANULARITY: u64 = 1 << 29;

/// The environment `Buffer.__init__` leaves for one job, and the NVSHMEM settings it gives:
/// the user's variables (`user`, whose values the validator parsed into `settings`) with
/// DeepEP's writes on top (`deepep`: the job's buffer and mode; `None` for a traffic job).
/// Each write sets the variable's text and its typed value together.
pub fn effective_env(
    user: &BTreeMap<String, String>,
    mut settings: NvshmemSettings,
    deepep: Option<(&BufferSettings, EpMode)>,
) -> (BTreeMap<String, EnvVar>, NvshmemSettings) {
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
    let Some((buffer, mode)) = deepep else { return (env, settings) };
    // buffer.py:105: only `if self.runtime.get_num_rdma_ranks() > 1 or low_latency_mode`.
    if !mode.uses_nvshmem() {
        return (env, settings);
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
    settings.disable_p2p = !buffer.allow_nvlink_for_low_latency_mode;
    write("NVSHMEM_DISABLE_P2P", if settings.disable_p2p { "1" } else { "0" }.into(), "108");
    write("NVSHMEM_IB_ENABLE_IBGDA", "1".into(), "109");
    settings.num_rc_per_pe = buffer.num_qps_per_rank;
    write("NVSHMEM_IBGDA_NUM_RC_PER_PE", buffer.num_qps_per_rank.to_string(), "110");
    write("NVSHMEM_MAX_TEAMS", "7".into(), "118");
    write("NVSHMEM_DISABLE_NVLS", "1".into(), "120");
    write("NVSHMEM_CUMEM_GRANULARITY", CUMEM_GRANULARITY.to_string(), "122");
    if !buffer.allow_mnnvl {
        settings.disable_mnnvl = true;
        write("NVSHMEM_DISABLE_MNNVL", "1".into(), "124-126");
    }
    // buffer.py:113-114: `os.environ['NVSHMEM_QP_DEPTH'] = os.environ.get('NVSHMEM_QP_DEPTH', '1024')`:
    // the depth NVSHMEM applies is the user's (or its own default, the same 1024) either way.
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
    (env, settings)
}

/// Values NVSHMEM reads from the environment at initialisation, typed, as the backends use
/// them. The validator parses the user's values (reporting malformed ones) and
/// [`effective_env`] applies DeepEP's writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvshmemSettings {
    /// `NVSHMEM_IB_SL` (default 0): SL of every QP of the job (the Ethernet priority on RoCE).
    pub ib_sl: u8,
    /// `NVSHMEM_IB_TRAFFIC_CLASS` when the job sets it (NVSHMEM's default is 0).
    pub traffic_class: Option<u8>,
    /// Effective WQ depth: rounded up to a power of two, clamped to [128, 32768].
    pub qp_depth: u32,
    /// `NVSHMEM_DISABLE_P2P`: peers reached over NVLink use RDMA instead.
    pub disable_p2p: bool,
    /// `NVSHMEM_DISABLE_MNNVL`: cross-node NVLink peers use RDMA.
    pub disable_mnnvl: bool,
    /// `NVSHMEM_IBGDA_NUM_RC_PER_PE` (NVSHMEM default 2).
    pub num_rc_per_pe: u32,
    /// `NVSHMEM_IB_GID_INDEX` when set to an index (RoCE; `None`: NVSHMEM picks one).
    pub gid_index: Option<u32>,
}

impl Default for NvshmemSettings {
    /// NVSHMEM's defaults, for a job that sets nothing.
    fn default() -> Self {
        NvshmemSettings {
            ib_sl: 0,
            traffic_class: None,
            qp_depth: DEFAULT_QP_DEPTH,
            disable_p2p: false,
            disable_mnnvl: false,
            num_rc_per_pe: 2,
            gid_index: None,
        }
    }
}

/// Parse an integer environment value the way NVSHMEM does (decimal).
pub fn parse_env_u64(value: &str) -> Option<u64> {
    value.trim().parse().ok()
}

/// A boolean environment value as NVSHMEM reads it (anything else is false).
pub fn parse_env_bool(value: &str) -> bool {
    matches!(value.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "y" | "on")
}

/// `NVSHMEM_QP_DEPTH` as NVSHMEM applies it (docs/design.md, fabric §6: power of 2 in [128,
/// 32768]).
pub fn effective_qp_depth(requested: u64) -> u32 {
    let clamped = requested.clamp(MIN_QP_DEPTH as u64, MAX_QP_DEPTH as u64);
    clamped.next_power_of_two() as u32
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
    use crate::scenario::schema::BufferSpec;

    fn buffer(text: &str) -> BufferSettings {
        BufferSettings::from(&toml::from_str::<BufferSpec>(text).unwrap())
    }

    #[test]
    fn intranode_normal_writes_nothing() {
        let user = BTreeMap::from([("NVSHMEM_IB_SL".to_string(), "3".to_string())]);
        let b = buffer("");
        let (env, _) =
            effective_env(&user, NvshmemSettings::default(), Some((&b, EpMode::Intranode)));
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
        let (env, s) =
            effective_env(&user, NvshmemSettings::default(), Some((&b, EpMode::LowLatency)));
        assert_eq!(env["NVSHMEM_DISABLE_P2P"].value, "1");
        assert_eq!(env["NVSHMEM_DISABLE_P2P"].overwritten.as_deref(), Some("0"));
        assert_eq!(env["NVSHMEM_IBGDA_NUM_RC_PER_PE"].value, "16");
        assert_eq!(env["NVSHMEM_QP_DEPTH"].value, "2048");
        assert_eq!(env["NVSHMEM_QP_DEPTH"].origin, EnvOrigin::UserKeptByDeepEp);
        assert_eq!(env["NVSHMEM_DISABLE_MNNVL"].value, "1");
        assert_eq!(env["NVSHMEM_IB_SL"].origin, EnvOrigin::User);
        assert_eq!(env["NVSHMEM_CUMEM_GRANULARITY"].value, "536870912");
        assert_eq!((s.num_rc_per_pe, s.disable_p2p, s.disable_mnnvl), (16, true, true));
        let mnnvl = buffer("low_latency_mode = true\nallow_mnnvl = true");
        let (env, s) = effective_env(
            &BTreeMap::new(),
            NvshmemSettings::default(),
            Some((&mnnvl, EpMode::LowLatency)),
        );
        assert!(!env.contains_key("NVSHMEM_DISABLE_MNNVL"));
        assert_eq!(env["NVSHMEM_QP_DEPTH"].value, "1024");
        assert_eq!(
            (s.qp_depth, s.num_rc_per_pe, s.disable_p2p, s.disable_mnnvl, s.ib_sl),
            (1024, 24, false, false, 0)
        );
    }

    /// Every variable DeepEP writes reads back, as NVSHMEM parses it, as the typed setting.
    #[test]
    fn typed_settings_match_the_written_text() {
        for text in [
            "low_latency_mode = true",
            "low_latency_mode = true\nallow_nvlink_for_low_latency_mode = false\nnum_qps_per_rank = 3",
            "low_latency_mode = true\nallow_mnnvl = true\nnum_qps_per_rank = 32",
            "num_qps_per_rank = 12",
        ] {
            let b = buffer(text);
            for mode in [EpMode::LowLatency, EpMode::Internode] {
                let (env, s) =
                    effective_env(&BTreeMap::new(), NvshmemSettings::default(), Some((&b, mode)));
                let get = |k: &str| env.get(k).map(|v| v.value.as_str());
                assert_eq!(s.disable_p2p, get("NVSHMEM_DISABLE_P2P").is_some_and(parse_env_bool));
                assert_eq!(
                    s.disable_mnnvl,
                    get("NVSHMEM_DISABLE_MNNVL").is_some_and(parse_env_bool)
                );
                assert_eq!(
                    Some(s.num_rc_per_pe as u64),
                    get("NVSHMEM_IBGDA_NUM_RC_PER_PE").and_then(parse_env_u64)
                );
                assert_eq!(
                    Some(s.qp_depth as u64),
                    get("NVSHMEM_QP_DEPTH").and_then(parse_env_u64)
                );
            }
        }
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
