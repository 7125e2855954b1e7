//! Slurm's compact lists: host lists (`gpu[01-04,07],login1`, as in `SLURM_JOB_NODELIST`) and
//! task counts per node (`2(x3),1`, as in `SLURM_STEP_TASKS_PER_NODE`). Pure; malformed input
//! is an error naming the variable's text and what is wrong with it.

/// Hosts a list may expand to before it is refused (a typo like `n[1-99999999]` must not
/// allocate gigabytes).
const MAX_HOSTS: usize = 1 << 20;

/// Expands a Slurm host list. Brackets hold comma-separated numbers and `lo-hi` ranges; the
/// width of `lo` is kept (`[08-10]` gives `08 09 10`); several bracket groups in one name
/// expand as a product (`r[1-2]n[1-2]` gives `r1n1 r1n2 r2n1 r2n2`), as Slurm does.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, String> {
    let bad = |why: String| format!("host list `{list}`: {why}");
    let mut hosts = Vec::new();
    for entry in split_top_level(list).map_err(&bad)? {
        let entry = entry.trim();
        if entry.is_empty() {
            return Err(
                bad("an empty host name (two commas in a row, or a trailing comma)".into()),
            );
        }
        let mut names = vec![String::new()];
        let mut rest = entry;
        while !rest.is_empty() {
            match rest.find('[') {
                None => {
                    if rest.contains(']') {
                        return Err(bad(format!("`]` without `[` in `{entry}`")));
                    }
                    names.iter_mut().for_each(|n| n.push_str(rest));
                    rest = "";
                }
                Some(open) => {
                    let prefix = &rest[..open];
                    if prefix.contains(']') {
                        return Err(bad(format!("`]` without `[` in `{entry}`")));
                    }
                    let close = rest[open..]
                        .find(']')
                        .map(|c| open + c)
                        .ok_or_else(|| bad(format!("`[` without `]` in `{entry}`")))?;
                    let suffixes = expand_brackets(&rest[open + 1..close]).map_err(&bad)?;
                    if names.len().saturating_mul(suffixes.len()) > MAX_HOSTS {
                        return Err(bad(format!("expands to more than {MAX_HOSTS} hosts")));
                    }
                    names = names
                        .iter()
                        .flat_map(|n| suffixes.iter().map(move |s| format!("{n}{prefix}{s}")))
                        .collect();
                    rest = &rest[close + 1..];
                }
            }
        }
        hosts.extend(names);
        if hosts.len() > MAX_HOSTS {
            return Err(bad(format!("expands to more than {MAX_HOSTS} hosts")));
        }
    }
    if hosts.is_empty() {
        return Err(bad("no host in it".into()));
    }
    Ok(hosts)
}

/// Splits at commas outside brackets.
fn split_top_level(list: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth > 0 => return Err("nested `[`".into()),
            '[' => depth = 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&list[start..]);
    Ok(parts)
}

/// `01-04,07` → `01 02 03 04 07`.
fn expand_brackets(inner: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for item in inner.split(',') {
        let item = item.trim();
        let (lo, hi) = item.split_once('-').unwrap_or((item, item));
        let number = |s: &str| -> Result<u64, String> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("`{item}` in `[{inner}]` is not a number or a range lo-hi"));
            }
            s.parse::<u64>().map_err(|_| format!("`{s}` in `[{inner}]` is too large"))
        };
        let (lo_n, hi_n) = (number(lo)?, number(hi)?);
        if hi_n < lo_n {
            return Err(format!("range `{item}` in `[{inner}]` runs backwards"));
        }
        if hi_n - lo_n >= MAX_HOSTS as u64 {
            return Err(format!("range `{item}` holds more than {MAX_HOSTS} numbers"));
        }
        let width = lo.len();
        out.extend((lo_n..=hi_n).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

/// Expands Slurm's tasks-per-node list: `2(x3),1` → `[2, 2, 2, 1]`.
pub fn expand_tasks_per_node(list: &str) -> Result<Vec<usize>, String> {
    let bad = |why: String| format!("tasks-per-node list `{list}`: {why}");
    let mut counts = Vec::new();
    for item in list.split(',') {
        let item = item.trim();
        let (count, repeat) = match item.split_once('(') {
            None => (item, "1"),
            Some((count, rest)) => {
                let repeat = rest
                    .strip_prefix('x')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(|| bad(format!("`{item}` is not `N` or `N(xM)`")))?;
                (count, repeat)
            }
        };
        let count: usize =
            count.parse().map_err(|_| bad(format!("`{count}` in `{item}` is not a count")))?;
        let repeat: usize =
            repeat.parse().map_err(|_| bad(format!("`{repeat}` in `{item}` is not a count")))?;
        if repeat > MAX_HOSTS || counts.len() + repeat > MAX_HOSTS {
            return Err(bad(format!("names more than {MAX_HOSTS} nodes")));
        }
        counts.extend(std::iter::repeat_n(count, repeat));
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hostlists_expand_like_slurm() {
        assert_eq!(
            expand_hostlist("gpu[01-04,07],login1").unwrap(),
            ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "login1"]
        );
        assert_eq!(expand_hostlist("node7").unwrap(), ["node7"]);
        assert_eq!(expand_hostlist("n[8-11]").unwrap(), ["n8", "n9", "n10", "n11"]);
        assert_eq!(expand_hostlist("n[098-100]").unwrap(), ["n098", "n099", "n100"]);
        assert_eq!(
            expand_hostlist("r[1-2]n[1-2],x[5]").unwrap(),
            ["r1n1", "r1n2", "r2n1", "r2n2", "x5"]
        );
        assert_eq!(expand_hostlist("a[1-2]-ib").unwrap(), ["a1-ib", "a2-ib"]);
    }

    #[test]
    fn malformed_hostlists_say_what_is_wrong() {
        let err = |s: &str| expand_hostlist(s).unwrap_err();
        assert!(err("gpu[01-04").contains("`[` without `]`"), "{}", err("gpu[01-04"));
        assert!(err("gpu01]").contains("`]` without `[`"));
        assert!(err("gpu[04-01]").contains("runs backwards"));
        assert!(err("gpu[a-b]").contains("is not a number"));
        assert!(err("gpu[1-]").contains("is not a number"));
        assert!(err("gpu[[1]]").contains("nested"));
        assert!(err("a,,b").contains("empty host name"));
        assert!(err("").contains("empty host name"));
        assert!(err("n[0-99999999]").contains("more than"));
        assert!(err("n[0-999],m[0-999]x[0-9999]").contains("more than"));
        assert!(err("gpu[01-04").starts_with("host list `gpu[01-04`"));
    }

    #[test]
    fn tasks_per_node_expand() {
        assert_eq!(expand_tasks_per_node("2(x3),1").unwrap(), [2, 2, 2, 1]);
        assert_eq!(expand_tasks_per_node("8").unwrap(), [8]);
        assert!(expand_tasks_per_node("2(3)").unwrap_err().contains("`2(3)`"));
        assert!(expand_tasks_per_node("x").unwrap_err().contains("not a count"));
        assert!(expand_tasks_per_node("1(x99999999)").unwrap_err().contains("more than"));
    }

    proptest! {
        #![proptest_config(eptwin_engine::testing::proptest_config(256))]
        /// Ranges round-trip: a list built from hosts and ranges expands to exactly them.
        #[test]
        fn ranges_expand_to_every_number(lo in 0u64..500, len in 0u64..40, width in 1usize..5) {
            let hi = lo + len;
            let list = format!("h[{lo:0width$}-{hi}],z");
            let hosts = expand_hostlist(&list).unwrap();
            prop_assert_eq!(hosts.len() as u64, len + 2);
            for (i, h) in hosts[..hosts.len() - 1].iter().enumerate() {
                let expected = format!("h{:0width$}", lo + i as u64);
                prop_assert_eq!(h, &expected);
            }
        }
    }
}
