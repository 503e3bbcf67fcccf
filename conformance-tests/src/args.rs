//! The test binary's command line, read as libtest reads it: any number of filters.
//!
//! libtest-mimic takes one positional filter and refuses a second, while `cargo test -- a:: b::`
//! runs the tests that match either. So the filters are taken out here, libtest-mimic parses the
//! rest, and the runner has libtest-mimic skip, by exact name, every trial no filter selects.

use libtest_mimic::Arguments;

/// The options of libtest (and libtest-mimic) that take a value as the next argument: that
/// argument is the option's value, not a filter.
const TAKES_VALUE: &[&str] = &[
    "--test-threads",
    "--logfile",
    "--skip",
    "--color",
    "--format",
    "-Z",
];

/// The parsed command line: libtest-mimic's arguments, without filters, and the filters.
pub(crate) struct CommandLine {
    pub(crate) arguments: Arguments,
    filters: Vec<String>,
}

impl CommandLine {
    /// Parses this process's arguments (exits with a usage message on a bad one, as libtest does).
    pub(crate) fn from_env() -> Self {
        Self::parse(std::env::args_os().map(|a| a.to_string_lossy().into_owned()))
    }

    /// Parses `argv`, the program name first.
    pub(crate) fn parse(argv: impl IntoIterator<Item = String>) -> Self {
        let mut rest = Vec::new();
        let mut filters = Vec::new();
        let mut argv = argv.into_iter();
        rest.extend(argv.next());
        let mut only_positional = false;
        while let Some(arg) = argv.next() {
            if only_positional || !arg.starts_with('-') || arg == "-" {
                filters.push(arg);
            } else if arg == "--" {
                only_positional = true;
            } else {
                let value_follows = TAKES_VALUE.contains(&arg.as_str());
                rest.push(arg);
                if value_follows {
                    rest.extend(argv.next());
                }
            }
        }
        Self {
            arguments: Arguments::from_iter(rest),
            filters,
        }
    }

    /// Whether the trial named `name` is selected: it contains a filter (equals one, with
    /// `--exact`), or no filter is given; and it matches no `--skip`.
    pub(crate) fn selects(&self, name: &str) -> bool {
        let matches = |pattern: &String| {
            if self.arguments.exact {
                name == pattern
            } else {
                name.contains(pattern.as_str())
            }
        };
        (self.filters.is_empty() || self.filters.iter().any(matches))
            && !self.arguments.skip.iter().any(matches)
    }

    /// libtest-mimic's arguments that run exactly the trials [`selects`](Self::selects) keeps,
    /// among `names`: the others are skipped by their exact names, so that the closing line
    /// still counts them as filtered out.
    pub(crate) fn arguments_for<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Arguments {
        let mut arguments = self.arguments.clone();
        arguments.skip = names
            .into_iter()
            .filter(|name| !self.selects(name))
            .map(String::from)
            .collect();
        arguments.exact = true;
        arguments
    }
}

#[cfg(test)]
mod tests {
    use super::CommandLine;

    fn parse(args: &[&str]) -> CommandLine {
        CommandLine::parse(
            std::iter::once("suite")
                .chain(args.iter().copied())
                .map(String::from),
        )
    }

    #[test]
    fn no_filter_selects_everything() {
        let line = parse(&["--test-threads", "2"]);
        assert!(line.selects("conformance::fencing::tokens_rise"));
        assert_eq!(line.arguments.test_threads, Some(2));
    }

    #[test]
    fn several_filters_select_what_matches_any() {
        let line = parse(&["fencing::", "--skip", "slow", "waiting::"]);
        assert!(line.selects("conformance::fencing::tokens_rise"));
        assert!(line.selects("conformance::waiting::release_wakes_waiter"));
        assert!(!line.selects("conformance::expiry::lease_ends"));
        assert!(!line.selects("conformance::fencing::slow_one"));
        assert_eq!(line.arguments.filter, None);
    }

    #[test]
    fn exact_filters_match_whole_names() {
        let line = parse(&["--exact", "conformance::a", "conformance::b"]);
        assert!(line.selects("conformance::b"));
        assert!(!line.selects("conformance::bc"));
    }

    #[test]
    fn values_of_options_are_not_filters() {
        let line = parse(&[
            "--format=terse",
            "--color",
            "never",
            "--logfile",
            "log",
            "x",
        ]);
        assert!(line.selects("x::y"));
        assert!(!line.selects("never"));
        assert!(!line.selects("log"));
    }

    #[test]
    fn the_rest_are_skipped_by_exact_name() {
        let line = parse(&["a::", "--skip", "a::c"]);
        let arguments = line.arguments_for(["a::b", "a::c", "b::a", "a::bb"]);
        assert_eq!(arguments.skip, ["a::c", "b::a"]);
        assert!(arguments.exact);
        assert_eq!(arguments.filter, None);
    }

    #[test]
    fn arguments_after_a_double_dash_are_filters() {
        let line = parse(&["--", "--odd"]);
        assert!(line.selects("conformance::--odd"));
        assert!(!line.selects("conformance::even"));
    }
}
