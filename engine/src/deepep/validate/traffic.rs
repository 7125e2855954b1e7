//! Background traffic jobs (`[job.traffic]`).

use super::Job;
use crate::diag::Diagnostics;
use crate::scenario::schema::{OpKind, TrafficPattern, TrafficSpec};

pub(super) fn check(job: &Job<'_>, traffic: &TrafficSpec, d: &mut Diagnostics<'_>) {
    let (prefix, name, ranks) = (job.prefix.as_str(), job.name(), job.ranks);
    let key = |k: &str| format!("{prefix}.traffic.{k}");
    if ranks.len() < 2 {
        d.error(
            "traffic-ranks",
            &format!("{prefix}.ranks"),
            name,
            "background traffic needs at least 2 ranks".into(),
        );
    }
    if traffic.bytes_per_rank.bytes() == 0 {
        d.error(
            "traffic-bytes",
            &key("bytes_per_rank"),
            name,
            "bytes_per_rank = 0 moves nothing".into(),
        );
    }
    if traffic.message_bytes.is_some_and(|m| m.bytes() == 0) {
        d.error("traffic-message", &key("message_bytes"), name, "message_bytes must be > 0".into());
    }
    if traffic.qps_per_peer == 0 {
        d.error("traffic-qps", &key("qps_per_peer"), name, "qps_per_peer must be ≥ 1".into());
    }
    match (traffic.pattern, traffic.incast_target) {
        (TrafficPattern::Incast, None) => d.error(
            "incast-target",
            &key("incast_target"),
            name,
            "pattern = \"incast\" needs incast_target (a global rank of this job)".into(),
        ),
        (TrafficPattern::Incast, Some(t)) if !ranks.contains(&t) => d.error(
            "incast-target",
            &key("incast_target"),
            name,
            format!("incast_target = {t} is not one of the job's ranks"),
        ),
        (p, Some(_)) if p != TrafficPattern::Incast => d.advisory(
            "incast-target",
            &key("incast_target"),
            name,
            "incast_target is ignored unless pattern = \"incast\"".into(),
        ),
        _ => {}
    }
    if traffic.ops.iter().any(|&op| op != OpKind::Transfer) {
        d.error(
            "traffic-ops",
            &key("ops"),
            name,
            "background jobs run ops = [\"transfer\"]".into(),
        );
    }
    if traffic.iterations == 0 {
        d.error("iterations", &key("iterations"), name, "iterations must be ≥ 1".into());
    }
}
