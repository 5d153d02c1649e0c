//! `splitos run`'s options of the embedded cluster: each component's configuration struct,
//! flattened, whose options given on the command line override what the embedded cluster
//! starts with.
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Command, FromArgMatches};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::pcomp::{fitting_excache, FittingExcache};
use super::{ClusterConfig, ConfigError, GmConfig, Loopback, McompConfig, NcompConfig, PcompConfig, TransportConfig};

/// What becomes of a component's options on `run` when the program goes to a running cluster,
/// which keeps its own configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Running {
    /// An error: they decide how much memory the cluster has and how it is kept, and a test
    /// meant for 1 GiB would fill the running cluster's.
    Refused,
    /// A note that names them.
    Noted,
}

/// How a component's configuration shows on `splitos run`.
pub trait OnRun {
    /// Put before each option (`mem`: `--mem-capacity`), for components whose options would
    /// otherwise collide with another's.
    const PREFIX: &'static str;
    /// The heading of its options in `--help`.
    const HEADING: &'static str;
    const ON_A_RUNNING_CLUSTER: Running;
    /// Fields whose options a run on a running cluster takes for its own job instead.
    const PER_JOB: &'static [&'static str] = &[];
}

impl OnRun for PcompConfig {
    const PREFIX: &'static str = "";
    const HEADING: &'static str = "The embedded cluster's pComponent";
    const ON_A_RUNNING_CLUSTER: Running = Running::Noted;
    const PER_JOB: &'static [&'static str] = &["interleave", "interleave_unit"];
}

impl OnRun for McompConfig {
    const PREFIX: &'static str = "mem";
    const HEADING: &'static str = "Each of the embedded cluster's mComponents";
    const ON_A_RUNNING_CLUSTER: Running = Running::Refused;
}

impl OnRun for GmConfig {
    const PREFIX: &'static str = "";
    const HEADING: &'static str = "The embedded cluster's global managers";
    const ON_A_RUNNING_CLUSTER: Running = Running::Refused;
}

impl OnRun for TransportConfig {
    const PREFIX: &'static str = "";
    const HEADING: &'static str = "The embedded cluster's transport";
    const ON_A_RUNNING_CLUSTER: Running = Running::Noted;
}

/// The options of `T` given on the command line, to put over a configuration: only those, so
/// that a default never overrides what the configuration says. An option's id is its field's
/// path in `T`'s serde form (`tcp.spin_us`).
pub struct Override<T> {
    value: T,
    /// The ids of the options given, and the options as written.
    given: Vec<(String, String)>,
}

impl<T: Args + OnRun> Override<T> {
    /// `T`'s own options.
    fn own() -> Command {
        T::augment_args(Command::new("splitos").no_binary_name(true))
    }

    /// An option of `T` as it shows on `run`.
    fn outer(a: &clap::Arg) -> (String, Option<String>) {
        let long = a.get_long().map(str::to_string);
        match T::PREFIX {
            "" => (a.get_id().to_string(), long),
            p => (format!("{p}.{}", a.get_id()), long.map(|l| format!("{p}-{l}"))),
        }
    }
}

impl<T: Args + OnRun> Args for Override<T> {
    fn augment_args(mut cmd: Command) -> Command {
        for a in Self::own().get_arguments() {
            let (id, long) = Self::outer(a);
            // Shown in the order of `run`'s options, under the component's heading unless the
            // option has its own.
            let heading = a.get_help_heading().unwrap_or(T::HEADING).to_string();
            let mut a = a.clone().id(id).display_order(None).help_heading(heading);
            if let Some(long) = long {
                a = a.long(long);
            }
            cmd = cmd.arg(a);
        }
        cmd
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl<T: Args + OnRun + FromArgMatches> FromArgMatches for Override<T> {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        // The options given, again as `T`'s own: parsed by `T` as its command would.
        let own = Self::own();
        let mut argv: Vec<std::ffi::OsString> = Vec::new();
        let mut given = Vec::new();
        for a in own.get_arguments() {
            let (id, long) = Self::outer(a);
            if m.value_source(&id) != Some(ValueSource::CommandLine) {
                continue;
            }
            let (Some(inner), Some(outer)) = (a.get_long(), long) else {
                continue;
            };
            given.push((a.get_id().to_string(), format!("--{outer}")));
            if !a.get_action().takes_values() {
                argv.push(format!("--{inner}").into());
                continue;
            }
            for occurrence in m.get_raw_occurrences(&id).into_iter().flatten() {
                argv.push(format!("--{inner}").into());
                argv.extend(occurrence.map(|v| v.to_os_string()));
            }
        }
        let value = T::from_arg_matches(&own.try_get_matches_from(argv)?)?;
        Ok(Override { value, given })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl<T: Serialize + DeserializeOwned> Override<T> {
    /// Whether the option of field `id` was given.
    pub fn gave(&self, id: &str) -> bool {
        self.given.iter().any(|(i, _)| i == id)
    }

    /// The options given, as written, but for those a run takes for its own job.
    pub fn flags(&self) -> impl Iterator<Item = &str>
    where
        T: OnRun,
    {
        self.given
            .iter()
            .filter(|(id, _)| !T::PER_JOB.contains(&id.as_str()))
            .map(|(_, flag)| flag.as_str())
    }

    /// The configuration the options were read into: a field whose option was not given
    /// holds its default.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// `to` with the options given in place of its values.
    pub fn apply(&self, to: &mut T) -> Result<(), ConfigError> {
        let from = serde_json::to_value(&self.value)?;
        let mut into = serde_json::to_value(&*to)?;
        for (id, _) in &self.given {
            let pointer = format!("/{}", id.replace('.', "/"));
            let no_such = || ConfigError::NoSuchOption(id.clone());
            let v = from.pointer(&pointer).ok_or_else(no_such)?;
            *into.pointer_mut(&pointer).ok_or_else(no_such)? = v.clone();
        }
        *to = serde_json::from_value(into)?;
        Ok(())
    }
}

/// `splitos run`'s options of the embedded cluster it starts when it runs on none other.
#[derive(Args)]
pub struct Embedded {
    #[command(flatten)]
    pub pcomp: Override<PcompConfig>,
    #[command(flatten)]
    pub mcomp: Override<McompConfig>,
    #[arg(long, help_heading = McompConfig::HEADING, help = format!("Number of mComponents of the embedded cluster [default: {}]", ClusterConfig::embedded().mcomponent.len()))]
    pub mcomponents: Option<usize>,
    /// Start an nComponent with the embedded cluster: the program's TCP sockets live on it
    /// (docs/network.md).
    #[arg(long, help_heading = PcompConfig::HEADING)]
    pub ncomponent: bool,
    #[command(flatten)]
    pub gm: Override<GmConfig>,
    #[command(flatten)]
    pub transport: Override<TransportConfig>,
}

impl Embedded {
    /// The embedded cluster's configuration with the options given, checked, and the ExCache
    /// sized for this host when none was asked for.
    pub fn config(&self) -> Result<(ClusterConfig, Option<FittingExcache>), ConfigError> {
        let mut cfg = ClusterConfig::embedded();
        let fitting = (!self.pcomp.gave("excache")).then(fitting_excache);
        if let Some(f) = &fitting {
            let p = &mut cfg.pcomponent[0];
            p.excache = f.size;
            // Growing it is for a cluster an operator runs: the bookkeeping of four times a
            // large ExCache would slow every run's start.
            p.excache_max = f.size;
        }
        if let Some(n) = self.mcomponents {
            cfg.mcomponent = vec![McompConfig::default(); n.max(1)];
        }
        self.pcomp.apply(&mut cfg.pcomponent[0])?;
        let p = &mut cfg.pcomponent[0];
        if fitting.is_some() && p.excache_max.0 != 0 {
            // Asked for at most this: the ExCache sized for the host stays within it.
            p.excache = p.excache.min(p.excache_max);
        }
        for m in &mut cfg.mcomponent {
            self.mcomp.apply(m)?;
        }
        self.gm.apply(&mut cfg.cluster)?;
        self.transport.apply(&mut cfg.transport)?;
        // `--polling` is how every waiter of the run polls, fault workers included.
        if self.transport.gave("polling") && !self.pcomp.gave("fault_polling") {
            cfg.pcomponent[0].fault_polling = cfg.transport.polling;
        }
        if self.ncomponent {
            // One machine: its loopback services are the user's, as for a native run.
            cfg.ncomponent = vec![NcompConfig {
                loopback: Loopback::Host,
                ..NcompConfig::default()
            }];
        }
        cfg.validate()?;
        Ok((cfg, fitting))
    }

    /// The interleaving a run on a running cluster asks for its job, if `--interleave` or
    /// `--interleave-unit` was given; the pComponent's own otherwise.
    pub fn job_interleave(&self) -> Option<(super::pcomp::InterleaveRatio, super::Size)> {
        let p = &self.pcomp;
        (p.gave("interleave") || p.gave("interleave_unit")).then(|| (p.value().interleave, p.value().interleave_unit))
    }

    /// The options given, for a run that goes to a running cluster: an error for those it
    /// refuses, else those it ignores, to note.
    pub fn for_a_running_cluster(&self) -> Result<Vec<&str>, Vec<&str>> {
        fn of<T: OnRun + Serialize + DeserializeOwned>(o: &Override<T>) -> impl Iterator<Item = (Running, &str)> {
            o.flags().map(|f| (T::ON_A_RUNNING_CLUSTER, f))
        }
        let layout = [
            (Running::Refused, self.mcomponents.is_some(), "--mcomponents"),
            (Running::Noted, self.ncomponent, "--ncomponent"),
        ];
        let given: Vec<(Running, &str)> = of(&self.pcomp)
            .chain(of(&self.mcomp))
            .chain(of(&self.gm))
            .chain(of(&self.transport))
            .chain(layout.into_iter().filter(|(_, on, _)| *on).map(|(r, _, f)| (r, f)))
            .collect();
        let refused: Vec<&str> = given
            .iter()
            .filter(|(r, _)| *r == Running::Refused)
            .map(|(_, f)| *f)
            .collect();
        match refused.is_empty() {
            true => Ok(given.into_iter().map(|(_, f)| f).collect()),
            false => Err(refused),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::config::pcomp::{FITTING_EXCACHE_MAX, FITTING_EXCACHE_MIN};
    use crate::config::Size;

    #[derive(Parser)]
    struct Run {
        #[command(flatten)]
        embedded: Embedded,
    }

    fn run(args: &[&str]) -> Embedded {
        Run::try_parse_from(std::iter::once("run").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
            .embedded
    }

    #[test]
    fn only_the_options_given_override_the_embedded_cluster() {
        let e = run(&[
            "--excache",
            "1G",
            "--no-piggyback",
            "--mem-capacity",
            "2G",
            "--mcomponents",
            "3",
            "--tcp-delay-us",
            "7",
            "--polling",
            "adaptive",
            "--replication",
            "ec:2",
        ]);
        let (c, fitting) = e.config().unwrap();
        assert!(fitting.is_none(), "--excache was given");
        assert_eq!(
            c.pcomponent[0],
            PcompConfig {
                excache: Size(1 << 30),
                piggyback: false,
                fault_polling: splitos_rpc::poll::Polling::Adaptive,
                ..PcompConfig::default()
            }
        );
        assert_eq!(
            c.mcomponent,
            vec![
                McompConfig {
                    capacity: Size(2 << 30),
                    ..McompConfig::default()
                };
                3
            ]
        );
        assert_eq!(
            (c.transport.tcp.delay_us, c.transport.polling),
            (7, splitos_rpc::poll::Polling::Adaptive)
        );
        assert_eq!(c.cluster.replication, Some(splitos_rpc::Replication::Ec { data: 2 }));
        // None given: the ExCache is sized for the host, and only it differs.
        let (mut c, fitting) = run(&[]).config().unwrap();
        let f = fitting.unwrap();
        assert!((FITTING_EXCACHE_MIN..=FITTING_EXCACHE_MAX).contains(&f.size.0) && f.size.0.is_power_of_two());
        assert_eq!((c.pcomponent[0].excache, c.pcomponent[0].excache_max), (f.size, f.size));
        c.pcomponent[0] = PcompConfig::default();
        assert_eq!(c, ClusterConfig::embedded());
        // A bound asked for holds.
        let (c, _) = run(&["--excache-max", "1M"]).config().unwrap();
        assert_eq!(
            (c.pcomponent[0].excache.0, c.pcomponent[0].excache_max.0),
            (1 << 20, 1 << 20)
        );
        // What a file says stays unless an option says otherwise.
        let mut p = PcompConfig {
            ways: 4,
            ..PcompConfig::default()
        };
        run(&["--excache", "1G"]).pcomp.apply(&mut p).unwrap();
        assert_eq!((p.ways, p.excache.0), (4, 1 << 30));
    }

    #[test]
    fn a_running_cluster_refuses_the_options_of_its_memory_and_notes_the_rest() {
        assert_eq!(
            run(&["--excache", "4M", "--transport", "tcp", "--ncomponent"]).for_a_running_cluster(),
            Ok(vec!["--excache", "--transport", "--ncomponent"])
        );
        assert_eq!(
            run(&[
                "--excache",
                "4M",
                "--mem-workers",
                "2",
                "--vregion-size",
                "4M",
                "--mcomponents",
                "1"
            ])
            .for_a_running_cluster(),
            Err(vec!["--mem-workers", "--vregion-size", "--mcomponents"])
        );
        assert_eq!(run(&[]).for_a_running_cluster(), Ok(vec![]));
    }

    #[test]
    fn a_bad_value_is_refused_by_its_option() {
        let e = Run::try_parse_from(["run", "--huge-pages", "2m"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("--huge-pages") && e.contains("huge_pages") && e.contains("off, on"),
            "{e}"
        );
        assert!(run(&["--ways", "4", "--evict-reserve", "4"])
            .config()
            .unwrap_err()
            .to_string()
            .starts_with("pcomponent[0].evict_reserve"));
    }
}
