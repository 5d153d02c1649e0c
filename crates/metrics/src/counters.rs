//! Counter sets declared once: one list gives the struct's fields, the JSON keys of a
//! component's statistics and its Prometheus series with their help, so that adding a counter
//! is adding one field (and its doc comment) where it is declared.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::{Entry, Exposition, Kind};

/// One counter of a set, as the statistics and metrics show it.
#[derive(Clone, Copy)]
pub struct Field<'a> {
    /// The field's name: the JSON key, and the series' name between the set's prefix and
    /// `_total`.
    pub name: &'static str,
    /// The field's doc comment, as written.
    pub help: &'static str,
    pub atomic: &'a AtomicU64,
}

impl Field<'_> {
    pub fn value(&self) -> u64 {
        self.atomic.load(Relaxed)
    }

    /// Its series' name (after `splitos_`) in a set whose series start with `prefix`, and its
    /// value in the series' unit: a count of nanoseconds (`…_ns`) is shown in seconds,
    /// Prometheus's base unit.
    pub fn metric(&self, prefix: &str) -> (String, f64) {
        let scale = if self.name.ends_with("_ns") { 1e9 } else { 1.0 };
        (series_name(prefix, self.name), self.value() as f64 / scale)
    }
}

/// The series' name (after `splitos_`) of the field `name` in a set whose series start with
/// `prefix`: a count of nanoseconds (`…_ns`) is one of seconds.
fn series_name(prefix: &str, name: &str) -> String {
    match name.strip_suffix("_ns") {
        Some(stem) => format!("{prefix}_{stem}_seconds_total"),
        None => format!("{prefix}_{name}_total"),
    }
}

/// The catalogue's entry of the field `name` with the doc comment `help` in a set whose series
/// start with `prefix`.
pub fn entry(prefix: &str, name: &str, help: &str) -> Entry {
    Entry {
        name: series_name(prefix, name),
        kind: Kind::Counter,
        help: crate::help_line(help),
        labels: vec![],
    }
}

/// The counters as the fields of a JSON object, keyed by name.
pub fn json<'a>(fields: impl IntoIterator<Item = Field<'a>>) -> serde_json::Map<String, serde_json::Value> {
    fields
        .into_iter()
        .map(|c| (c.name.to_string(), c.value().into()))
        .collect()
}

/// The object `extra` with the counters added as fields (a component's statistics: its counters
/// and the state it reports beside them).
pub fn json_with<'a>(fields: impl IntoIterator<Item = Field<'a>>, extra: serde_json::Value) -> serde_json::Value {
    let mut j = json(fields);
    if let serde_json::Value::Object(o) = extra {
        j.extend(o);
    }
    j.into()
}

/// Renders the counters as the Prometheus counters `splitos_PREFIX_NAME_total`, described by
/// their help.
pub fn render<'a>(e: &mut Exposition, prefix: &str, fields: impl IntoIterator<Item = Field<'a>>) {
    for c in fields {
        let (name, value) = c.metric(prefix);
        e.write(&name, Kind::Counter, c.help, [(std::iter::empty(), value)]);
    }
}

/// Declares a struct of `AtomicU64` counters whose series start with `splitos_<prefix>` (the
/// literal after the struct's name), each with a doc comment (its help text), and, after
/// `also`, the struct's other fields, each with its initial value. Gives the struct `Default`
/// (counters at zero), `counters()` (every counter in declaration order, for [`json`]),
/// `render()` (its series) and `declared()` (its entries in the catalogue).
///
/// ```ignore
/// counters! {
///     /// What the counters count for.
///     pub struct Stats: "pcomp_things" {
///         /// Requests answered.
///         requests,
///     }
///     also {
///         pub errors: Mutex<Vec<String>> = Mutex::default(),
///     }
/// }
/// ```
#[macro_export]
macro_rules! counters {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident: $prefix:literal {
            $( $(#[doc = $doc:literal])+ $counter:ident, )+
        }
        $( also {
            $( $(#[$fmeta:meta])* $fvis:vis $field:ident: $ty:ty = $init:expr, )+
        } )?
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $( $(#[doc = $doc])+ pub $counter: ::std::sync::atomic::AtomicU64, )+
            $($( $(#[$fmeta])* $fvis $field: $ty, )+)?
        }

        impl Default for $name {
            fn default() -> Self {
                $name {
                    $( $counter: ::std::sync::atomic::AtomicU64::new(0), )+
                    $($( $field: $init, )+)?
                }
            }
        }

        impl $name {
            /// Every counter, in the order they are declared.
            pub fn counters(&self) -> impl Iterator<Item = $crate::counters::Field<'_>> {
                [$(
                    $crate::counters::Field {
                        name: stringify!($counter),
                        help: concat!($($doc, "\n"),+),
                        atomic: &self.$counter,
                    },
                )+]
                .into_iter()
            }

            /// Renders the counters as their Prometheus series.
            pub fn render(&self, e: &mut $crate::Exposition) {
                $crate::counters::render(e, $prefix, self.counters());
            }

            /// The counters' entries in the catalogue.
            pub fn declared() -> ::std::vec::Vec<$crate::Entry> {
                ::std::vec![$( $crate::counters::entry($prefix, stringify!($counter), concat!($($doc, "\n"),+)) ),+]
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    counters! {
        /// Two counters and a field that is not one.
        struct Two: "x" {
            /// Things
            /// counted.
            things,
            /// Others.
            others,
            /// Time, in nanoseconds.
            time_ns,
        }
        also {
            label: &'static str = "two",
        }
    }

    #[test]
    fn a_declaration_gives_fields_names_help_and_json() {
        let t = Two::default();
        t.things.fetch_add(3, Relaxed);
        assert_eq!(t.label, "two");
        let all: Vec<Field> = t.counters().collect();
        t.time_ns.store(1_500_000_000, Relaxed);
        assert_eq!(
            all.iter().map(|c| (c.name, c.value())).collect::<Vec<_>>(),
            [("things", 3), ("others", 0), ("time_ns", 1_500_000_000)]
        );
        assert_eq!(all[0].metric("x"), ("x_things_total".to_string(), 3.0));
        assert_eq!(all[2].metric("x"), ("x_time_seconds_total".to_string(), 1.5));
        assert_eq!(
            serde_json::Value::from(json(t.counters())),
            serde_json::json!({"things": 3, "others": 0, "time_ns": 1_500_000_000u64})
        );
        assert_eq!(
            Two::declared()
                .iter()
                .map(|e| (e.name.as_str(), e.help.as_str()))
                .collect::<Vec<_>>(),
            [
                ("x_things_total", "Things counted."),
                ("x_others_total", "Others."),
                ("x_time_seconds_total", "Time, in nanoseconds.")
            ]
        );
        let mut e = Exposition::new(String::new());
        t.render(&mut e);
        assert!(e
            .text()
            .contains("# TYPE splitos_x_time_seconds_total counter\nsplitos_x_time_seconds_total 1.5\n"));
    }
}
