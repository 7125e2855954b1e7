//! Which of the scenario's ranks each process runs: contiguous blocks of `ranks_per_process`
//! (default 1), process p owning `p*K .. (p+1)*K`. Pure.

use std::ops::Range;

use super::error::GroupError;

/// The ranks of each process, by process rank. `total_ranks` is the scenario's (every job's
/// ranks, as the plan numbers them), `process_count` the launch's.
pub fn rank_blocks(
    total_ranks: usize,
    process_count: usize,
    ranks_per_process: Option<usize>,
) -> Result<Vec<Range<usize>>, GroupError> {
    let per = ranks_per_process.unwrap_or(1);
    if per == 0 {
        return Err(GroupError::RankMapping("--ranks-per-process must be at least 1".into()));
    }
    if process_count.checked_mul(per) != Some(total_ranks) {
        let covered = process_count.saturating_mul(per);
        let rank_s = |n: usize| if n == 1 { "rank" } else { "ranks" };
        let process_s = |n: usize| if n == 1 { "process" } else { "processes" };
        let mut ways = Vec::new();
        if total_ranks.is_multiple_of(per) {
            let n = total_ranks / per;
            ways.push(match ranks_per_process {
                Some(k) => format!("start {n} {} with --ranks-per-process {k}", process_s(n)),
                None => format!("start {n} {}", process_s(n)),
            });
        }
        // Keep close to the process count asked for: the largest count up to it that divides
        // the ranks (or the smallest above it).
        let divides = |p: &usize| total_ranks.is_multiple_of(*p) && *p * per != total_ranks;
        let near = (1..=process_count.min(total_ranks))
            .rev()
            .find(divides)
            .filter(|&p| p > 1 || process_count == 1)
            .or_else(|| (process_count + 1..=total_ranks).find(divides));
        if let Some(p) = near {
            let k = total_ranks / p;
            let lead = if ways.is_empty() { "start" } else { "or" };
            ways.push(format!("{lead} {p} with --ranks-per-process {k}"));
        }
        let how = if ways.is_empty() { String::new() } else { format!(": {}", ways.join(", ")) };
        return Err(GroupError::RankMapping(format!(
            "the scenario has {total_ranks} {}; {process_count} {} × {per} {} per process = \
             {covered}{how}",
            rank_s(total_ranks),
            process_s(process_count),
            rank_s(per),
        )));
    }
    Ok((0..process_count).map(|p| p * per..(p + 1) * per).collect())
}

/// Checks that every process's ranks lie on one scenario node: a process drives the GPUs of
/// one machine only.
pub fn check_blocks_on_one_node(
    blocks: &[Range<usize>],
    node_of_rank: impl Fn(usize) -> usize,
) -> Result<(), GroupError> {
    for (process, block) in blocks.iter().enumerate() {
        let first_node = node_of_rank(block.start);
        if let Some(other) = block.clone().find(|&r| node_of_rank(r) != first_node) {
            return Err(GroupError::RankMapping(format!(
                "process {process} would run ranks {}..{} but rank {} is on scenario node {} and \
                 rank {other} on node {}: a process cannot span nodes; choose a \
                 --ranks-per-process that divides the ranks per node",
                block.start,
                block.end - 1,
                block.start,
                first_node,
                node_of_rank(other)
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn blocks_are_contiguous() {
        assert_eq!(rank_blocks(8, 8, None).unwrap(), (0..8).map(|r| r..r + 1).collect::<Vec<_>>());
        assert_eq!(rank_blocks(8, 2, Some(4)).unwrap(), vec![0..4, 4..8]);
        assert_eq!(rank_blocks(1, 1, None).unwrap(), vec![0..1]);
    }

    #[test]
    fn mismatches_say_how_to_start_instead() {
        let e = rank_blocks(8, 3, None).unwrap_err().to_string();
        assert_eq!(
            e,
            "the scenario has 8 ranks; 3 processes × 1 rank per process = 3: start 8 \
             processes, or 2 with --ranks-per-process 4"
        );
        let e = rank_blocks(8, 2, Some(3)).unwrap_err().to_string();
        assert_eq!(
            e,
            "the scenario has 8 ranks; 2 processes × 3 ranks per process = 6: start 2 with \
             --ranks-per-process 4"
        );
        let e = rank_blocks(8, 4, Some(4)).unwrap_err().to_string();
        assert!(
            e.contains(
                "start 2 processes with --ranks-per-process 4, or 4 with --ranks-per-process 2"
            ),
            "{e}"
        );
        let e = rank_blocks(7, 2, None).unwrap_err().to_string();
        assert!(e.ends_with("× 1 rank per process = 2: start 7 processes"), "{e}");
        assert!(rank_blocks(4, 1, Some(0)).unwrap_err().to_string().contains("at least 1"));
    }

    #[test]
    fn a_process_cannot_span_nodes() {
        let node = |r: usize| r / 4;
        check_blocks_on_one_node(&rank_blocks(8, 2, Some(4)).unwrap(), node).unwrap();
        check_blocks_on_one_node(&rank_blocks(8, 4, Some(2)).unwrap(), node).unwrap();
        let e = check_blocks_on_one_node(&[0..3, 3..6, 6..9], node).unwrap_err().to_string();
        assert!(
            e.starts_with("process 1 would run ranks 3..5 but rank 3 is on scenario node 0 and rank 4 on node 1"),
            "{e}"
        );
    }

    proptest! {
        #![proptest_config(eptwin_engine::testing::proptest_config(256))]
        /// Whenever the blocks exist they partition 0..R in order, K ranks each.
        #[test]
        fn blocks_partition_the_ranks(r in 1usize..200, p in 1usize..50, k in proptest::option::of(1usize..10)) {
            match rank_blocks(r, p, k) {
                Ok(blocks) => {
                    prop_assert_eq!(blocks.len(), p);
                    let mut next = 0;
                    for b in &blocks {
                        prop_assert_eq!(b.start, next);
                        prop_assert_eq!(b.len(), k.unwrap_or(1));
                        next = b.end;
                    }
                    prop_assert_eq!(next, r);
                }
                Err(e) => {
                    prop_assert_ne!(p * k.unwrap_or(1), r);
                    let expected = format!("the scenario has {r} ");
                    prop_assert!(e.to_string().contains(&expected), "{}", e);
                }
            }
        }
    }
}
