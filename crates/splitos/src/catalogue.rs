//! Every series a splitos component may export, from each crate's declarations: what
//! `splitos cluster metrics --declared` prints, and what every component describes to its
//! metrics recorder (so each series carries its help).
use splitos_metrics::Entry;

/// The whole catalogue, crate by crate from the bottom up.
pub fn all() -> Vec<Entry> {
    [
        splitos_ebb::series::declared(),
        splitos_rpc::series::declared(),
        splitos_core::series::declared(),
        splitos_excache::series::all(),
        splitos_pmon::series::all(),
        splitos_mmon::series::all(),
        splitos_smon::series::declared(),
        splitos_nmon::series::all(),
        splitos_gm::series::declared(),
    ]
    .concat()
}

/// The catalogue as an exposition without samples: each series' help and type, and its labels
/// in a comment line of their own.
pub fn render() -> String {
    let mut out = String::new();
    for e in all() {
        let name = format!("{}_{}", splitos_metrics::PREFIX, e.name);
        out.push_str(&format!("# HELP {name} {}\n# TYPE {name} {}\n", e.help, e.kind.name()));
        if !e.labels.is_empty() {
            out.push_str(&format!("# LABELS {name} {}\n", e.labels.join(",")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use splitos_metrics::Exposition;

    #[test]
    fn every_series_is_declared_once_with_help_and_a_name_prometheus_accepts() {
        let all = all();
        let mut seen = std::collections::HashSet::new();
        for e in &all {
            assert!(seen.insert(e.name.clone()), "{} is declared twice", e.name);
            assert!(!e.help.is_empty(), "{} has no help", e.name);
            assert!(
                e.name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{} is not a Prometheus name of ours",
                e.name
            );
            assert_eq!(
                e.kind == splitos_metrics::Kind::Counter,
                e.name.ends_with("_total"),
                "{}: counters, and only counters, end in _total",
                e.name
            );
        }
        // Rendered families name their declarations: one shown here is in the catalogue.
        let mut x = Exposition::new(String::new());
        x.one(&splitos_smon::series::USED_BYTES, 1.0);
        assert!(render().contains("# TYPE splitos_scomp_used_bytes gauge\n"));
        assert!(x
            .text()
            .contains("# HELP splitos_scomp_used_bytes Bytes the vNodes' files take.\n"));
    }
}
