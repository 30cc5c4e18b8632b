//! `levee-chaos run`: the chaos suite against real processes. Exits
//! non-zero when any scenario fails.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use levee_chaos::runner::{self, report, scenario, Binaries, Profile};

/// Command line of `levee-chaos`.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "Levee's chaos suite: real processes, injected faults, numeric assertions"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run scenarios and write chaos-report/.
    Run {
        /// `ci` (about 3 minutes for all) or `full` (longer, heavier).
        #[arg(long, default_value = "ci")]
        profile: String,
        /// Only these scenarios (repeatable); all by default.
        #[arg(long = "scenario", visible_alias = "only", value_name = "NAME")]
        scenarios: Vec<String>,
        /// Report directory.
        #[arg(long, default_value = "chaos-report")]
        out: PathBuf,
        /// The levee binary; default: `levee` next to this executable.
        #[arg(long)]
        levee: Option<PathBuf>,
        /// The simulator binary; default: `levee-upstream-sim` next to this executable.
        #[arg(long)]
        sim: Option<PathBuf>,
    },
    /// List the scenarios.
    List,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::List => {
            for name in scenario::NAMES {
                if let Some(s) = scenario::by_name(name, &Profile::CI) {
                    say(&format!("{name:26} {}", s.summary));
                }
            }
            Ok(())
        }
        Command::Run {
            profile,
            scenarios,
            out,
            levee,
            sim,
        } => {
            let profile = Profile::named(&profile)
                .with_context(|| format!("unknown profile {profile:?} (ci, full)"))?;
            let names: Vec<String> = if scenarios.is_empty() {
                scenario::NAMES.iter().map(|s| (*s).to_owned()).collect()
            } else {
                scenarios
            };
            let mut selected = Vec::new();
            for name in &names {
                match scenario::by_name(name, &profile) {
                    Some(s) => selected.push(s),
                    None => bail!("unknown scenario {name:?}; `levee-chaos list` names them"),
                }
            }
            let bins = Binaries {
                levee: binary(levee, "levee")?,
                sim: binary(sim, "levee-upstream-sim")?,
            };
            let report = runner::run(&profile, &selected, &bins).await;
            for s in &report.scenarios {
                print_scenario(s);
            }
            report::write(&report, &out)?;
            say(&format!(
                "{} in {:.1}s; report in {}",
                if report.passed {
                    "all scenarios passed"
                } else {
                    "SOME SCENARIOS FAILED"
                },
                report.wall_time_s,
                out.join("report.json").display()
            ));
            if !report.passed {
                std::process::exit(1);
            }
            Ok(())
        }
    }
}

/// One scenario's verdict and assertions, then its contrast's, whose
/// verdict is not the scenario's.
fn print_scenario(s: &report::ScenarioReport) {
    let variant = s
        .variant
        .as_deref()
        .map_or_else(String::new, |v| format!(" ({v})"));
    say(&format!(
        "{} {}{variant}",
        if s.passed { "PASS" } else { "FAIL" },
        s.name
    ));
    print_details(s, "    ");
    if let Some(c) = &s.contrast {
        say(&format!(
            "    contrast ({}), shown for comparison, not part of the verdict:",
            c.variant.as_deref().unwrap_or("contrast")
        ));
        print_details(c, "        ");
    }
}

fn print_details(s: &report::ScenarioReport, indent: &str) {
    if let Some(e) = &s.error {
        say(&format!("{indent}error: {e}"));
    }
    for a in &s.assertions {
        say(&format!(
            "{indent}[{}] {}: {} | measured: {}",
            if a.passed { "ok" } else { "FAILED" },
            a.name,
            a.expected,
            a.measured
        ));
    }
}

/// The given path, or the sibling binary called `name`.
fn binary(given: Option<PathBuf>, name: &str) -> anyhow::Result<PathBuf> {
    match given {
        Some(path) if path.is_file() => Ok(path),
        Some(path) => bail!("{} does not exist (build it: cargo build --bins)", path.display()),
        None => runner::sibling_binary(name)
            .with_context(|| format!("no `{name}` next to this executable: build it (cargo build --bins) or pass its path")),
    }
}

/// The report goes to stdout.
#[allow(clippy::print_stdout)]
fn say(line: &str) {
    println!("{line}");
}
