//! DeepEP's test scripts a replay runs, by family ([`ScriptFamily`]), and their command-line
//! flags parsed and written ([`ScriptArgs`]; docs/deepep-replay.md, "The scripts").

use std::fmt;

use eptwin_engine::api::EpMode;

use crate::subject::Subject;

/// A family of DeepEP's test scripts: one launch convention, one set of flags and printed
/// lines. A replay picks the family ([`ScriptFamily::of`]), then the family's script for the
/// job's mode; the family's rules (`launch::v1`) say where its scripts differ from the
/// scenario. A second family adds a variant here, its scripts to [`Script`], and its rules and
/// line formats beside V1's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptFamily {
    /// DeepEP V1's `tests/test_intranode.py`, `test_internode.py` and `test_low_latency.py`:
    /// one script per mode, started once per node (`WORLD_SIZE` = nodes, `RANK` = node rank)
    /// with one process per local GPU.
    V1,
}

impl ScriptFamily {
    /// Every family, in the order a script path is looked up.
    pub const ALL: [ScriptFamily; 1] = [ScriptFamily::V1];

    /// The family that replays `subject` (DeepEP V1's scripts for every scenario today).
    pub fn of(_subject: &Subject) -> ScriptFamily {
        ScriptFamily::V1
    }

    /// The family's scripts.
    pub fn scripts(self) -> &'static [Script] {
        match self {
            ScriptFamily::V1 => &[Script::Intranode, Script::Internode, Script::LowLatency],
        }
    }

    /// The family's script for a job of `mode`.
    pub fn script_for(self, mode: EpMode) -> Script {
        match self {
            ScriptFamily::V1 => match mode {
                EpMode::Intranode => Script::Intranode,
                EpMode::Internode => Script::Internode,
                EpMode::LowLatency => Script::LowLatency,
            },
        }
    }
}

/// One of DeepEP's test scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Script {
    Intranode,
    Internode,
    LowLatency,
}

impl Script {
    pub fn family(self) -> ScriptFamily {
        match self {
            Script::Intranode | Script::Internode | Script::LowLatency => ScriptFamily::V1,
        }
    }

    pub fn file_name(self) -> &'static str {
        match self {
            Script::Intranode => "test_intranode.py",
            Script::Internode => "test_internode.py",
            Script::LowLatency => "test_low_latency.py",
        }
    }

    /// The script a path names (`DeepEP/tests/test_low_latency.py`, `tests/legacy/...`).
    pub fn from_path(path: &str) -> Option<Script> {
        let name = path.rsplit('/').next().unwrap_or(path);
        ScriptFamily::ALL.iter().flat_map(|f| f.scripts()).copied().find(|s| s.file_name() == name)
    }

    /// Flags this script accepts (docs/deepep-replay.md, "The scripts"), value-taking ones marked `true`.
    fn flags(self) -> &'static [(&'static str, bool)] {
        match self {
            Script::Intranode => &[
                ("--num-processes", true),
                ("--num-tokens", true),
                ("--hidden", true),
                ("--num-topk", true),
                ("--num-experts", true),
                ("--allow-mnnvl", false),
                ("--use-fabric", false),
            ],
            Script::Internode => &[
                ("--num-processes", true),
                ("--num-tokens", true),
                ("--hidden", true),
                ("--num-topk-groups", true),
                ("--num-topk", true),
                ("--num-experts", true),
                ("--test-ll-compatibility", false),
                ("--pressure-test-mode", true),
            ],
            Script::LowLatency => &[
                ("--num-processes", true),
                ("--num-tokens", true),
                ("--hidden", true),
                ("--num-topk", true),
                ("--num-experts", true),
                ("--allow-mnnvl", false),
                ("--disable-nvlink", false),
                ("--use-logfmt", false),
                ("--pressure-test", false),
                ("--shrink-test", false),
            ],
        }
    }
}

impl fmt::Display for Script {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.file_name())
    }
}

/// The scripts' command-line flags. Absent flags take the script's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptArgs {
    pub script: Script,
    /// Local ranks per node (one process per GPU).
    pub num_processes: u32,
    /// Tokens per rank.
    pub num_tokens: u32,
    pub hidden: u32,
    pub num_topk: u32,
    pub num_experts: u32,
    /// test_internode.py: nodes a token may reach; `None` = the script's `min(nodes, 4)`.
    pub num_topk_groups: Option<u32>,
    pub allow_mnnvl: bool,
    pub use_fabric: bool,
    pub disable_nvlink: bool,
    pub use_logfmt: bool,
    /// Flags eptwin never emits that change what the script measures (`--pressure-test`,
    /// `--shrink-test`, `--test-ll-compatibility`, `--pressure-test-mode N`), as written.
    pub other: Vec<String>,
}

impl ScriptArgs {
    /// The script's defaults (docs/deepep-replay.md, "The scripts").
    pub fn defaults(script: Script) -> ScriptArgs {
        let (num_tokens, num_experts) = match script {
            Script::LowLatency => (128, 288),
            Script::Intranode | Script::Internode => (4096, 256),
        };
        ScriptArgs {
            script,
            num_processes: 8,
            num_tokens,
            hidden: 7168,
            num_topk: 8,
            num_experts,
            num_topk_groups: None,
            allow_mnnvl: false,
            use_fabric: false,
            disable_nvlink: false,
            use_logfmt: false,
            other: Vec::new(),
        }
    }

    /// Every workload flag written out (defaults too, so the line says everything).
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            "--num-processes".to_string(),
            self.num_processes.to_string(),
            "--num-tokens".into(),
            self.num_tokens.to_string(),
            "--hidden".into(),
            self.hidden.to_string(),
        ];
        if let Some(groups) = self.num_topk_groups {
            args.extend(["--num-topk-groups".into(), groups.to_string()]);
        }
        args.extend([
            "--num-topk".into(),
            self.num_topk.to_string(),
            "--num-experts".into(),
            self.num_experts.to_string(),
        ]);
        for (on, flag) in [
            (self.allow_mnnvl, "--allow-mnnvl"),
            (self.use_fabric, "--use-fabric"),
            (self.disable_nvlink, "--disable-nvlink"),
            (self.use_logfmt, "--use-logfmt"),
        ] {
            if on {
                args.push(flag.into());
            }
        }
        args.extend(self.other.iter().cloned());
        args
    }

    /// Parse a script's arguments back (argparse style: `--flag value` or `--flag=value`).
    pub fn parse<S: AsRef<str>>(script: Script, args: &[S]) -> Result<ScriptArgs, String> {
        let mut out = ScriptArgs::defaults(script);
        let mut i = 0;
        while i < args.len() {
            let arg = args[i].as_ref();
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) => (f, Some(v)),
                None => (arg, None),
            };
            let Some(&(_, takes_value)) = script.flags().iter().find(|(f, _)| *f == flag) else {
                return Err(format!("{script} has no argument {arg:?}"));
            };
            let value = if takes_value {
                match inline {
                    Some(v) => Some(v.to_string()),
                    None => {
                        i += 1;
                        Some(
                            args.get(i)
                                .map(|v| v.as_ref().to_string())
                                .ok_or_else(|| format!("{flag} needs a value"))?,
                        )
                    }
                }
            } else {
                None
            };
            i += 1;
            let number = |v: &Option<String>| -> Result<u32, String> {
                let v = v.as_deref().unwrap_or_default();
                v.parse().map_err(|_| format!("{flag} expects an integer, found {v:?}"))
            };
            match flag {
                "--num-processes" => out.num_processes = number(&value)?,
                "--num-tokens" => out.num_tokens = number(&value)?,
                "--hidden" => out.hidden = number(&value)?,
                "--num-topk" => out.num_topk = number(&value)?,
                "--num-experts" => out.num_experts = number(&value)?,
                "--num-topk-groups" => out.num_topk_groups = Some(number(&value)?),
                "--allow-mnnvl" => out.allow_mnnvl = true,
                "--use-fabric" => out.use_fabric = true,
                "--disable-nvlink" => out.disable_nvlink = true,
                "--use-logfmt" => out.use_logfmt = true,
                other => {
                    out.other.push(other.to_string());
                    out.other.extend(value);
                }
            }
        }
        Ok(out)
    }

    /// The top-k groups the script uses on `nodes` nodes (`--num-topk-groups`, default
    /// `min(nodes, 4)`); `None` for the scripts without group-limited routing.
    pub fn topk_groups_on(&self, nodes: u32) -> Option<u32> {
        (self.script == Script::Internode).then(|| self.num_topk_groups.unwrap_or(nodes.min(4)))
    }

    /// Where `self` (a log's arguments) differs from `expected`: (flag, log value, expected).
    pub fn differences(&self, expected: &ScriptArgs, nodes: u32) -> Vec<(String, String, String)> {
        let mut out = Vec::new();
        if self.script != expected.script {
            out.push(("script".to_string(), self.script.to_string(), expected.script.to_string()));
            return out;
        }
        let mut push = |flag: &str, log: String, want: String| {
            if log != want {
                out.push((flag.to_string(), log, want));
            }
        };
        push("--num-processes", self.num_processes.to_string(), expected.num_processes.to_string());
        push("--num-tokens", self.num_tokens.to_string(), expected.num_tokens.to_string());
        push("--hidden", self.hidden.to_string(), expected.hidden.to_string());
        push("--num-topk", self.num_topk.to_string(), expected.num_topk.to_string());
        push("--num-experts", self.num_experts.to_string(), expected.num_experts.to_string());
        let groups = |a: &ScriptArgs| a.topk_groups_on(nodes).map_or("-".into(), |g| g.to_string());
        push("--num-topk-groups", groups(self), groups(expected));
        let on = |b: bool| if b { "set" } else { "absent" }.to_string();
        push("--allow-mnnvl", on(self.allow_mnnvl), on(expected.allow_mnnvl));
        push("--use-fabric", on(self.use_fabric), on(expected.use_fabric));
        push("--disable-nvlink", on(self.disable_nvlink), on(expected.disable_nvlink));
        push("--use-logfmt", on(self.use_logfmt), on(expected.use_logfmt));
        push("other flags", self.other.join(" "), expected.other.join(" "));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_round_trip_every_script() {
        for script in [Script::Intranode, Script::Internode, Script::LowLatency] {
            let mut args = ScriptArgs::defaults(script);
            args.num_processes = 4;
            args.num_tokens = 77;
            args.hidden = 4096;
            args.num_experts = 64;
            match script {
                Script::Intranode => args.use_fabric = true,
                Script::Internode => args.num_topk_groups = Some(3),
                Script::LowLatency => {
                    args.disable_nvlink = true;
                    args.use_logfmt = true;
                    args.allow_mnnvl = true;
                }
            }
            let parsed = ScriptArgs::parse(script, &args.to_args()).unwrap();
            assert_eq!(parsed, args, "{script}");
            assert!(parsed.differences(&args, 2).is_empty());
        }
    }

    #[test]
    fn parse_applies_defaults_and_rejects_foreign_flags() {
        let none: [&str; 0] = [];
        let ll = ScriptArgs::parse(Script::LowLatency, &none).unwrap();
        assert_eq!((ll.num_tokens, ll.num_experts, ll.num_processes), (128, 288, 8));
        let inter = ScriptArgs::parse(Script::Internode, &["--num-tokens=512"]).unwrap();
        assert_eq!(inter.num_tokens, 512);
        assert_eq!(inter.topk_groups_on(2), Some(2));
        assert_eq!(inter.topk_groups_on(8), Some(4));
        let err = ScriptArgs::parse(Script::Internode, &["--disable-nvlink"]).unwrap_err();
        assert!(err.contains("test_internode.py has no argument"), "{err}");
        let err = ScriptArgs::parse(Script::LowLatency, &["--hidden"]).unwrap_err();
        assert!(err.contains("--hidden needs a value"), "{err}");
        let err = ScriptArgs::parse(Script::LowLatency, &["--hidden", "x"]).unwrap_err();
        assert!(err.contains("integer"), "{err}");
        let pressure =
            ScriptArgs::parse(Script::Internode, &["--pressure-test-mode", "1"]).unwrap();
        assert_eq!(pressure.other, ["--pressure-test-mode", "1"]);
        let diffs = pressure.differences(&ScriptArgs::defaults(Script::Internode), 2);
        assert_eq!(diffs, [("other flags".into(), "--pressure-test-mode 1".into(), "".into())]);
    }

    proptest::proptest! {
        #![proptest_config(eptwin_engine::testing::proptest_config(256))]
        #[test]
        fn any_args_round_trip(
            script in proptest::sample::select(vec![Script::Intranode, Script::Internode, Script::LowLatency]),
            numbers in proptest::array::uniform5(1u32..100_000),
            groups in proptest::option::of(1u32..20),
            switches in proptest::array::uniform4(proptest::bool::ANY),
        ) {
            let mut args = ScriptArgs::defaults(script);
            [args.num_processes, args.num_tokens, args.hidden, args.num_topk, args.num_experts] = numbers;
            // Each script has only its own flags.
            match script {
                Script::Intranode => {
                    (args.allow_mnnvl, args.use_fabric) = (switches[0], switches[1]);
                }
                Script::Internode => args.num_topk_groups = groups,
                Script::LowLatency => {
                    (args.allow_mnnvl, args.disable_nvlink, args.use_logfmt) =
                        (switches[0], switches[2], switches[3]);
                }
            }
            let parsed = ScriptArgs::parse(script, &args.to_args()).unwrap();
            proptest::prop_assert_eq!(&parsed, &args);
            proptest::prop_assert!(parsed.differences(&args, 4).is_empty());
        }
    }

    #[test]
    fn script_from_path() {
        assert_eq!(Script::from_path("DeepEP/tests/test_low_latency.py"), Some(Script::LowLatency));
        assert_eq!(Script::from_path("test_internode.py"), Some(Script::Internode));
        assert_eq!(Script::from_path("tests/test_other.py"), None);
    }
}
