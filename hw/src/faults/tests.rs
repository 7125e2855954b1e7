//! OpFaults against the bundled fault scenarios: waivers, launch keys, delays, dead ranks.

use std::path::Path;

use eptwin_engine::testing::ScenarioDraft;

use super::*;

fn plan(name: &str) -> Plan {
    ScenarioDraft::read(Path::new(&format!("scenarios/faults/{name}.toml"))).plan()
}

fn each_rank_alone(n: u32) -> Vec<Vec<u32>> {
    (0..n).map(|r| vec![r]).collect()
}

fn faults_of(p: &Plan, mine: &[u32], devices: &[Vec<u32>], processes: usize) -> OpFaults {
    OpFaults::check(p, &p.jobs[0], mine, devices, processes)
        .expect("the hardware injects it")
        .expect("the plan has faults")
}

#[test]
fn a_plan_without_faults_has_no_hooks() {
    let p = ScenarioDraft::bundled("ep16-ll").plan();
    assert!(OpFaults::check(&p, &p.jobs[0], &[0], &[vec![0]], 16).unwrap().is_none());
    assert!(!OpFaults::needs_delay_kernel(&p));
}

#[test]
fn a_straggler_delays_its_own_launch_only() {
    let p = plan("ep16-ll-straggler");
    assert!(OpFaults::needs_delay_kernel(&p));
    let f = faults_of(&p, &(0..16).collect::<Vec<_>>(), &each_rank_alone(16), 16);
    let key = f.launch_key(OpKind::Dispatch, 0, false);
    let delays = f.delays_ns(&each_rank_alone(16), key);
    assert_eq!(delays[3], 50_000);
    assert_eq!(delays.iter().sum::<u64>(), 50_000, "{delays:?}");
}

#[test]
fn launch_keys_count_rounds_as_the_simulator_does() {
    let p = plan("ep16-ll-straggler");
    let f = faults_of(&p, &[3], &[vec![3]], 16);
    let warmup = p.jobs[0].warmup as u64;
    assert_eq!(f.launch_key(OpKind::Dispatch, 2, true).round, 2);
    assert_eq!(f.launch_key(OpKind::Combine, 2, false).round, warmup + 2);
    assert_eq!(f.launch_key(OpKind::Combine, 0, false).op_index, 1);
}

#[test]
fn a_straggler_sharing_a_launch_with_punctual_ranks_is_waived() {
    let p = plan("ep16-ll-straggler");
    let devices = vec![(0..8).collect::<Vec<u32>>(), (8..16).collect()];
    let e = OpFaults::check(&p, &p.jobs[0], &(0..16).collect::<Vec<_>>(), &devices, 1).unwrap_err();
    assert!(matches!(e, HwError::Unsupported(ref m) if m.contains("--spawn")), "{e}");
}

#[test]
fn a_dead_rank_needs_a_process_of_its_own_and_no_shrink_mode() {
    let p = plan("ep16-ll-rank-down");
    let single = OpFaults::check(&p, &p.jobs[0], &[0], &[vec![0]], 1).unwrap_err();
    assert!(single.to_string().contains("fault[0] rank_down"), "{single}");
    let f = faults_of(&p, &[5], &[vec![5]], 16);
    assert_eq!(f.down_rank(0), Some((5, 0)));
    let other = faults_of(&p, &[4], &[vec![4]], 16);
    assert_eq!(other.down_rank(u64::MAX), None);
    let shrink = plan("ep16-ll-rank-down-shrink");
    let e = OpFaults::check(&shrink, &shrink.jobs[0], &[5], &[vec![5]], 16).unwrap_err();
    assert!(e.to_string().contains("shrink"), "{e}");
}

#[test]
fn degraded_nvlink_is_waived_on_the_hardware() {
    let p = plan("ep8-normal-nvlink-degraded");
    let e = OpFaults::check(&p, &p.jobs[0], &[0], &[vec![0]], 8).unwrap_err();
    assert!(matches!(e, HwError::Unsupported(ref m) if m.contains("nvlink_degraded")), "{e}");
}
