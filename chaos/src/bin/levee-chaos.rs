//! `levee-chaos run`: the chaos suite against real processes. Exits
//! non-zero when any scenario fails. `levee-chaos soak`: a long mixed
//! load with faults and reloads; exits non-zero on growth or on a request
//! that ended as it should not.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use levee_chaos::runner::overhead::parse_duration;
use levee_chaos::runner::{self, report, scenario, soak, Binaries, Profile};

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
    /// A long run of mixed traffic, faults and reloads against one levee
    /// on Redis; fails when memory, descriptors or Redis grow after the
    /// warm-up, or when a request ends as it should not.
    Soak {
        /// How long traffic is sent (e.g. 60s, 30m); jobs then drain.
        #[arg(long, value_parser = parse_duration, default_value = "60s")]
        duration: Duration,
        /// Report directory (soak.json, samples.csv, soak.svg).
        #[arg(long, default_value = "soak-report")]
        out: PathBuf,
        /// The levee binary; default: `levee` next to this executable.
        #[arg(long)]
        levee: Option<PathBuf>,
        /// The simulator binary; default: `levee-upstream-sim` next to this executable.
        #[arg(long)]
        sim: Option<PathBuf>,
        /// Do not reload (without it, a levee with no
        /// `GET /admin/config` fails the soak).
        #[arg(long)]
        no_reload: bool,
    },
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
        Command::Soak {
            duration,
            out,
            levee,
            sim,
            no_reload,
        } => {
            let bins = Binaries {
                levee: binary(levee, "levee")?,
                sim: binary(sim, "levee-upstream-sim")?,
            };
            let spec = soak::SoakSpec {
                duration,
                reloads: !no_reload,
                rates: soak::Rates::default(),
            };
            let report = soak::run(&spec, &bins, &say).await?;
            print_soak(&report);
            soak::report::write(&report, &out)?;
            say(&format!(
                "soak {} in {:.1}s; report in {}",
                if report.passed { "passed" } else { "FAILED" },
                report.wall_time_s,
                out.join("soak.json").display()
            ));
            if !report.passed {
                std::process::exit(1);
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

/// A soak's figures: requests by kind, each series' slope against its
/// bound, the reloads, the assertions.
fn print_soak(r: &soak::SoakReport) {
    say(&format!(
        "{} soak: {:.0}s of traffic, warm-up {:.0}s, reloads {} ({})",
        if r.passed { "PASS" } else { "FAIL" },
        r.duration_s,
        r.warm_up_s,
        if r.reloads_enabled { "on" } else { "off" },
        r.reload_probe
    ));
    for (kind, counts) in &r.counts {
        let total: u64 = counts.values().sum();
        say(&format!("    requests {kind:?}: {total} {counts:?}"));
    }
    for s in &r.series {
        let bound = s
            .bound_per_min
            .map_or_else(|| "not judged".to_owned(), |b| format!("bound {b:.3}"));
        say(&format!(
            "    {:18} first {:9.2} start {:9.2} end {:9.2} max {:9.2} {}; slope {:+.3} {}/min ({bound})",
            s.name, s.first, s.start, s.end, s.max, s.unit, s.slope_per_min, s.unit
        ));
    }
    print_breakers(r);
    let broken = r.reloads.iter().filter(|x| x.broken).count();
    say(&format!(
        "    reloads: {} ({} broken files), {} ok; limited tenant admitted/s by limit: {:?}",
        r.reloads.len(),
        broken,
        r.reloads.iter().filter(|x| x.ok).count(),
        r.limited_admitted_per_s
    ));
    for a in &r.assertions {
        say(&format!(
            "    [{}] {}: {} | measured: {}",
            if a.passed { "ok" } else { "FAILED" },
            a.name,
            a.expected,
            a.measured
        ));
    }
}

/// The breakers seen not closed in the samples, with when.
fn print_breakers(r: &soak::SoakReport) {
    let mut not_closed: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    for sample in &r.samples {
        for b in &sample.breakers_not_closed {
            not_closed.entry(b).or_default().push(sample.t_s);
        }
    }
    for (breaker, at) in &not_closed {
        say(&format!(
            "    breaker {breaker}: {} samples, first at {:.0}s, last at {:.0}s",
            at.len(),
            at.first().unwrap_or(&0.0),
            at.last().unwrap_or(&0.0)
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
