//! The failure model of LegoOS section 6.3 (table 1), applied to the clusters a replay
//! actually needed, and the cost and effect of the project's memory redundancy schemes.
//!
//! A unit fails when any of its devices does and devices fail independently, so a unit's
//! failure rate is the sum of its devices' (the paper's harmonic mean), and a cluster's the
//! sum of its units'.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};

/// The inputs shipped with the binary (`--devices` replaces them).
pub const DEFAULT_DEVICES: &str = include_str!("devices.toml");

const SECONDS_PER_YEAR: f64 = 365.25 * 86400.0;

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct Devices {
    mttf_years: BTreeMap<String, f64>,
    units: Units,
    repair: Repair,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Units {
    server: Vec<String>,
    pcomponent: Vec<String>,
    mcomponent: Vec<String>,
    scomponent: Vec<String>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Repair {
    detect_seconds: f64,
    rebuild_mib_per_second: f64,
    backup_log_mib: f64,
}

/// Failures per year of each kind of unit.
#[derive(Clone, Copy, Debug)]
pub struct Rates {
    pub server: f64,
    pub pcomponent: f64,
    pub mcomponent: f64,
    pub scomponent: f64,
}

impl Devices {
    pub fn load(path: Option<&Path>) -> anyhow::Result<Devices> {
        let (text, name) = match path {
            Some(p) => (
                std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?,
                p.display().to_string(),
            ),
            None => (DEFAULT_DEVICES.to_string(), "the built-in device file".to_string()),
        };
        let d: Devices = toml::from_str(&text).map_err(|e| anyhow!("{name}: {e}"))?;
        for (dev, y) in &d.mttf_years {
            if !(y.is_finite() && *y > 0.0) {
                bail!("{name}: mttf_years.{dev} = {y}: must be a positive number of years");
            }
        }
        for (unit, devs) in [
            ("server", &d.units.server),
            ("pcomponent", &d.units.pcomponent),
            ("mcomponent", &d.units.mcomponent),
            ("scomponent", &d.units.scomponent),
        ] {
            if devs.is_empty() {
                bail!("{name}: units.{unit} has no devices");
            }
            if let Some(bad) = devs.iter().find(|x| !d.mttf_years.contains_key(*x)) {
                bail!(
                    "{name}: units.{unit}: unknown device `{bad}` (mttf_years has: {})",
                    d.mttf_years.keys().cloned().collect::<Vec<_>>().join(", ")
                );
            }
        }
        let r = &d.repair;
        let finite = [r.detect_seconds, r.rebuild_mib_per_second, r.backup_log_mib]
            .iter()
            .all(|v| v.is_finite());
        if !(finite && r.detect_seconds >= 0.0 && r.rebuild_mib_per_second > 0.0 && r.backup_log_mib >= 0.0) {
            bail!("{name}: repair: detect_seconds and backup_log_mib must be at least 0, rebuild_mib_per_second more than 0");
        }
        Ok(d)
    }

    fn rate(&self, devs: &[String]) -> f64 {
        devs.iter().map(|d| 1.0 / self.mttf_years[d]).sum()
    }

    pub fn rates(&self) -> Rates {
        Rates {
            server: self.rate(&self.units.server),
            pcomponent: self.rate(&self.units.pcomponent),
            mcomponent: self.rate(&self.units.mcomponent),
            scomponent: self.rate(&self.units.scomponent),
        }
    }
}

/// The units a model needed (its peak of units in use), and how often one fails.
#[derive(Serialize, Debug, Clone)]
pub struct Reliability {
    pub servers: usize,
    pub pcomponents: usize,
    pub mcomponents: usize,
    pub scomponents: usize,
    pub failures_per_year: f64,
    /// Mean time between hardware replacements anywhere in this cluster (none if it needed
    /// no units).
    pub cluster_mttf_days: Option<f64>,
    /// This cluster's MTTF over the fixed cluster's: LegoOS's "improves MTTF by 17% to 49%"
    /// is 1.17 to 1.49 here.
    pub mttf_vs_fixed: Option<f64>,
}

/// The fixed model needs `servers`; a disaggregated one `compute` and `memory` modules plus
/// the fixed cluster's disks as sComponents (storage is not replayed, so it is the same).
pub fn reliability(rates: &Rates, servers: usize, compute: Option<(usize, usize)>) -> Reliability {
    let fixed = servers as f64 * rates.server;
    let (p, m, s) = compute.map_or((0, 0, 0), |(p, m)| (p, m, servers));
    let rate = if compute.is_some() {
        p as f64 * rates.pcomponent + m as f64 * rates.mcomponent + s as f64 * rates.scomponent
    } else {
        fixed
    };
    Reliability {
        servers: if compute.is_some() { 0 } else { servers },
        pcomponents: p,
        mcomponents: m,
        scomponents: s,
        failures_per_year: rate,
        cluster_mttf_days: (rate > 0.0).then(|| 365.25 / rate),
        mttf_vs_fixed: (rate > 0.0 && fixed > 0.0).then(|| fixed / rate),
    }
}

/// The paper's own cases, per server's worth of hardware: its worst case is as many
/// components of each kind as servers, its best case half as many pComponents and
/// mComponents (full utilization where servers reach half).
#[derive(Serialize, Debug)]
pub struct PaperCases {
    pub server_mttf_years: f64,
    pub worst_mttf_years: f64,
    pub best_mttf_years: f64,
}

pub fn paper_cases(rates: &Rates) -> PaperCases {
    PaperCases {
        server_mttf_years: 1.0 / rates.server,
        worst_mttf_years: 1.0 / (rates.pcomponent + rates.mcomponent + rates.scomponent),
        best_mttf_years: 1.0 / (0.5 * rates.pcomponent + 0.5 * rates.mcomponent + rates.scomponent),
    }
}

/// Redundancy schemes of `[cluster] replication` (docs/failures.md) as the model sees them.
pub const SCHEMES: [&str; 6] = ["none", "replica", "log", "ec:2", "ec:4", "ec:8"];

#[derive(Serialize, Debug, Clone)]
pub struct Redundancy {
    pub scheme: &'static str,
    /// Memory on mComponents per byte of data.
    pub memory_factor: f64,
    /// mComponents the peak of data needs with this scheme.
    pub mcomponents: usize,
    pub memory_needed_gib: f64,
    /// How long a failed mComponent's data stays exposed: detection plus rebuilding it.
    pub exposure_seconds: f64,
    /// Expected data lost per year: data on failed mComponents that no other member can
    /// give back because another needed member failed within the exposure.
    pub expected_loss_gib_per_year: f64,
    pub failures_per_year: f64,
}

/// `data_mib`: the data on mComponents on average; `peak_mib`: at its peak; `module_mib`:
/// one mComponent's memory; `others`: failures per year of the rest of the cluster
/// (pComponents and sComponents).
pub fn redundancy(
    d: &Devices,
    rates: &Rates,
    data_mib: f64,
    peak_mib: f64,
    module_mib: f64,
    others: f64,
) -> Vec<Redundancy> {
    SCHEMES
        .iter()
        .filter_map(|&scheme| {
            let stripe: f64 = scheme
                .strip_prefix("ec:")
                .map_or(0.0, |k| k.parse().expect("an ec:K scheme"));
            let (factor, log) = match scheme {
                "none" => (1.0, 0.0),
                "replica" => (2.0, 0.0),
                "log" => (1.0, d.repair.backup_log_mib),
                _ => ((stripe + 1.0) / stripe, 0.0),
            };
            // An mComponent no larger than a logger's log cannot hold data besides it.
            if module_mib <= log {
                return None;
            }
            let room = module_mib - log;
            let mcomponents = ((peak_mib * factor / room).ceil() as usize).max(1);
            let per_unit = data_mib * factor / mcomponents as f64;
            let exposure = d.repair.detect_seconds + per_unit / d.repair.rebuild_mib_per_second;
            let window = exposure / SECONDS_PER_YEAR;
            // The chance that a member the lost data needs fails within the window: the one
            // other copy, the sComponent with the backup log, or one of K stripe members.
            let second = match scheme {
                "none" => 1.0,
                "replica" => rates.mcomponent * window,
                "log" => rates.scomponent * window,
                _ => stripe * rates.mcomponent * window,
            };
            Some(Redundancy {
                scheme,
                memory_factor: factor,
                mcomponents,
                memory_needed_gib: (peak_mib * factor + log * mcomponents as f64) / 1024.0,
                exposure_seconds: exposure,
                expected_loss_gib_per_year: rates.mcomponent * data_mib * second.min(1.0) / 1024.0,
                failures_per_year: others + mcomponents as f64 * rates.mcomponent,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_inputs_give_the_papers_server() {
        let d = Devices::load(None).unwrap();
        let r = d.rates();
        let p = paper_cases(&r);
        assert!((p.server_mttf_years - 5.8).abs() < 0.01, "{p:?}");
        assert!(
            p.worst_mttf_years > p.server_mttf_years && p.best_mttf_years > p.worst_mttf_years,
            "{p:?}"
        );
    }

    #[test]
    fn rates_add_up_over_units() {
        let r = Rates {
            server: 0.2,
            pcomponent: 0.05,
            mcomponent: 0.04,
            scomponent: 0.03,
        };
        let f = reliability(&r, 10, None);
        assert!((f.failures_per_year - 2.0).abs() < 1e-12 && (f.mttf_vs_fixed.unwrap() - 1.0).abs() < 1e-12);
        let s = reliability(&r, 10, Some((4, 5)));
        assert!((s.failures_per_year - (0.2 + 0.2 + 0.3)).abs() < 1e-12);
        assert!((s.mttf_vs_fixed.unwrap() - 2.0 / 0.7).abs() < 1e-9);
        let none = reliability(&r, 0, None);
        assert_eq!((none.cluster_mttf_days, none.mttf_vs_fixed), (None, None));
        assert_eq!((s.pcomponents, s.mcomponents, s.scomponents, s.servers), (4, 5, 10, 0));
    }

    #[test]
    fn redundancy_trades_memory_for_loss() {
        let d = Devices::load(None).unwrap();
        let r = d.rates();
        let v = redundancy(&d, &r, 1000.0 * 1024.0, 2000.0 * 1024.0, 100.0 * 1024.0, 0.0);
        let by = |s: &str| v.iter().find(|x| x.scheme == s).unwrap();
        assert_eq!(
            (
                by("none").mcomponents,
                by("replica").mcomponents,
                by("ec:4").mcomponents
            ),
            (20, 40, 25)
        );
        assert!((by("none").expected_loss_gib_per_year - r.mcomponent * 1000.0).abs() < 1e-9);
        for s in ["replica", "log", "ec:2", "ec:4", "ec:8"] {
            assert!(
                by(s).expected_loss_gib_per_year < by("none").expected_loss_gib_per_year / 1000.0,
                "{s}"
            );
        }
        assert!(by("ec:8").expected_loss_gib_per_year > by("ec:2").expected_loss_gib_per_year);
        assert!(
            by("log").memory_needed_gib > by("none").memory_needed_gib
                && by("log").memory_needed_gib < by("ec:8").memory_needed_gib
        );
    }

    #[test]
    fn bad_device_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.toml");
        let bad = DEFAULT_DEVICES.replace("pcomponent = [\"cpu\"", "pcomponent = [\"gpu\"");
        std::fs::write(&p, bad).unwrap();
        assert!(Devices::load(Some(&p))
            .unwrap_err()
            .to_string()
            .contains("units.pcomponent: unknown device `gpu`"));
        std::fs::write(&p, DEFAULT_DEVICES.replace("cpu = 204.3", "cpu = -1")).unwrap();
        assert!(Devices::load(Some(&p))
            .unwrap_err()
            .to_string()
            .contains("mttf_years.cpu"));
        std::fs::write(&p, DEFAULT_DEVICES.replace("[repair]", "[repair]\nextra = 1")).unwrap();
        assert!(Devices::load(Some(&p)).unwrap_err().to_string().contains("extra"));
    }
}
