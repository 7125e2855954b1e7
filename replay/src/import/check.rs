//! A log of another configuration than the scenario is an error naming both values: the
//! launch markers' script, nodes and flags, the `[config]` lines, the per-rank lines' rank
//! numbers and message counts, and the tuning lines' script.

use eptwin_engine::api::JobPlan;
use eptwin_engine::api::{ll_combine_msg_bytes, ll_dispatch_msg_bytes};
use eptwin_engine::scenario::schema::Dtype;

use super::parse::{Loc, Parsed, RankLine};
use crate::error::ReplayError;
use crate::launch::Launch;
use crate::launch::v1::SCRIPT_LL_MASKED;
use crate::script::{Script, ScriptArgs};
use crate::subject::Subject;

/// A log of another configuration than the scenario is an error naming both values.
pub(super) fn check_configuration(
    subject: &Subject,
    launch: &Launch,
    job: &JobPlan,
    parsed: &Parsed,
    where_: &dyn Fn(Loc) -> String,
) -> Result<(), ReplayError> {
    let mismatch = |loc: Loc, message: String| ReplayError::Log {
        location: where_(loc),
        message: format!("{message} (scenario {}, {})", subject.name, subject.file),
    };
    for (loc, m) in &parsed.markers {
        let script = m.script.unwrap_or(launch.script);
        if script != launch.script {
            return Err(mismatch(
                *loc,
                format!("the log ran {script}; the scenario replays with {}", launch.script),
            ));
        }
        let args = ScriptArgs::parse(script, &m.args)
            .map_err(|e| mismatch(*loc, format!("cannot read the launch line's arguments: {e}")))?;
        let nodes = m.nodes.unwrap_or(subject.nodes);
        if nodes != subject.nodes {
            return Err(mismatch(
                *loc,
                format!(
                    "the log ran on {nodes} node(s) (WORLD_SIZE); the scenario has {}",
                    subject.nodes
                ),
            ));
        }
        let diffs = args.differences(&launch.args, subject.nodes);
        if !diffs.is_empty() {
            let text: Vec<String> = diffs
                .iter()
                .map(|(flag, log, want)| format!("{flag} {log} in the log, {want} in the scenario"))
                .collect();
            return Err(mismatch(*loc, format!("another configuration: {}", text.join("; "))));
        }
    }
    let want = &launch.args;
    for (loc, pairs) in &parsed.configs {
        for (key, value) in pairs {
            let expected = match key.as_str() {
                "num_tokens" => Some(want.num_tokens),
                "hidden" => Some(want.hidden),
                "num_topk" => Some(want.num_topk),
                "num_experts" => Some(want.num_experts),
                "num_topk_groups" => want.topk_groups_on(subject.nodes),
                "num_ranks" => Some(job.num_ranks()),
                "num_nodes" => Some(subject.nodes),
                _ => None,
            };
            if let Some(expected) = expected
                && value.parse::<u32>().ok() != Some(expected)
            {
                return Err(mismatch(
                    *loc,
                    format!(
                        "another configuration: {key}={value} in the log, {expected} in the scenario"
                    ),
                ));
            }
        }
    }
    let n = job.num_ranks();
    for ((rank, _), (loc, _)) in &parsed.ranks {
        if launch.script != Script::LowLatency {
            return Err(mismatch(
                *loc,
                format!(
                    "a test_low_latency.py per-rank line; the scenario replays with {}",
                    launch.script
                ),
            ));
        }
        if *rank >= n {
            return Err(mismatch(
                *loc,
                format!("another configuration: rank {rank} in the log, {n} ranks in the scenario"),
            ));
        }
    }
    if launch.script == Script::LowLatency {
        // The LL script prints no configuration; its bandwidth × time counts the messages, so a
        // run with other tokens, top-k or hidden shows there. It masks up to 10 selections.
        let selections = f64::from(want.num_tokens * want.num_topk);
        let fewest = selections - f64::from(SCRIPT_LL_MASKED);
        let slack = selections * 0.005;
        let combine_dtype = if want.use_logfmt { Dtype::Logfmt } else { Dtype::Bf16 };
        for ((rank, _), (loc, line)) in &parsed.ranks {
            let RankLine::Kernels { dispatch_gbps, dispatch_us, combine_gbps, combine_us } = *line
            else {
                continue;
            };
            for (op, gbps, us, message_bytes) in [
                (
                    "dispatch",
                    dispatch_gbps,
                    dispatch_us,
                    ll_dispatch_msg_bytes(want.hidden, Dtype::Fp8),
                ),
                (
                    "combine",
                    combine_gbps,
                    combine_us,
                    ll_combine_msg_bytes(want.hidden, combine_dtype),
                ),
            ] {
                let counted = gbps * us * 1e3 / message_bytes as f64;
                if counted < fewest - slack || counted > selections + slack {
                    return Err(mismatch(
                        *loc,
                        format!(
                            "another configuration: rank {rank}'s {op} line counts {counted:.0} \
                             messages of {message_bytes} B ({gbps} GB/s x {us} us) in the log, \
                             {fewest}-{selections} ({} tokens x top-{}, up to {SCRIPT_LL_MASKED} \
                             masked) in the scenario",
                            want.num_tokens, want.num_topk
                        ),
                    ));
                }
            }
        }
    }
    let best = parsed.best.iter().map(|(l, t)| (l, t));
    for (loc, t) in best.chain(parsed.tuning.iter().map(|(l, t, _)| (l, t))) {
        if t.script() != launch.script {
            return Err(mismatch(
                *loc,
                format!(
                    "a {} tuning line; the scenario replays with {}",
                    t.script(),
                    launch.script
                ),
            ));
        }
    }
    Ok(())
}
