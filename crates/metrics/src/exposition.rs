//! The Prometheus text format of a component's families: each family's help and type once,
//! then its samples, each with the component's labels and its own.
use std::fmt::Write as _;

use crate::{Family, Kind, PREFIX};

/// Series being rendered: one family (its help, type and samples) at a time, as the text
/// format wants them.
pub struct Exposition {
    labels: String,
    text: String,
}

impl Exposition {
    /// An exposition whose every sample carries `labels` (`component="…",role="…"`, or none).
    pub fn new(labels: String) -> Exposition {
        Exposition {
            labels,
            text: String::new(),
        }
    }

    /// The declared family `series`, with one sample per entry of `samples`: its labels'
    /// values, in the declaration's order, and its value.
    pub fn family<const N: usize>(
        &mut self,
        series: &impl Family<N>,
        samples: impl IntoIterator<Item = ([String; N], f64)>,
    ) {
        let d = series.declaration();
        self.write(
            d.name,
            d.kind,
            d.help,
            samples
                .into_iter()
                .map(|(values, v)| (d.labels.iter().copied().zip(values).collect::<Vec<_>>(), v)),
        );
    }

    /// The declared family `series` without labels of its own: one sample.
    pub fn one(&mut self, series: &impl Family<0>, value: f64) {
        self.family(series, [([], value)]);
    }

    /// The family `splitos_NAME`; callers are the declared families and counter sets.
    pub(crate) fn write<L: IntoIterator<Item = (&'static str, String)>>(
        &mut self,
        name: &str,
        kind: Kind,
        help: &str,
        samples: impl IntoIterator<Item = (L, f64)>,
    ) {
        let _ = writeln!(
            self.text,
            "# HELP {PREFIX}_{name} {}",
            crate::help_line(help).replace('\\', "\\\\")
        );
        let _ = writeln!(self.text, "# TYPE {PREFIX}_{name} {}", kind.name());
        for (labels, value) in samples {
            let mut l = self.labels.clone();
            for (k, v) in labels {
                let comma = if l.is_empty() { "" } else { "," };
                let _ = write!(l, "{comma}{k}=\"{}\"", escape(&v));
            }
            let braced = if l.is_empty() { l } else { format!("{{{l}}}") };
            let _ = writeln!(self.text, "{PREFIX}_{name}{braced} {value}");
        }
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn into_text(self) -> String {
        self.text
    }
}

/// A label value as the text format quotes it.
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::series! {
        /// Misses
        /// of a job.
        JOB_MISSES: Counter["job", "vnode"] = "jobs_misses_total";
    }

    #[test]
    fn a_family_carries_the_components_labels_and_its_own() {
        assert_eq!(declared()[0].labels, ["job", "vnode"]);
        let mut e = Exposition::new("component=\"c\",role=\"pcomponent\"".into());
        e.family(&JOB_MISSES, [(["7".to_string(), "a\"b".to_string()], 5.0)]);
        assert_eq!(e.text, "# HELP splitos_jobs_misses_total Misses of a job.\n# TYPE splitos_jobs_misses_total counter\nsplitos_jobs_misses_total{component=\"c\",role=\"pcomponent\",job=\"7\",vnode=\"a\\\"b\"} 5\n");
    }
}
