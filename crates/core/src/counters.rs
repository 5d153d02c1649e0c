//! Counters declared once: one list gives the struct's fields, the JSON keys of a component's
//! statistics and its Prometheus metrics with their help, so that adding a counter is adding
//! one field (and its doc comment) where it is declared.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// One counter as the statistics and metrics show it.
#[derive(Clone, Copy)]
pub struct Counter<'a> {
    /// The field's name: the JSON key, and the Prometheus metric's name between the
    /// component's prefix and `_total`.
    pub name: &'static str,
    /// The field's doc comment, as written.
    pub help: &'static str,
    pub atomic: &'a AtomicU64,
}

impl Counter<'_> {
    pub fn value(&self) -> u64 {
        self.atomic.load(Relaxed)
    }

    /// Its Prometheus metric's name (after `splitos_`) for a component whose metrics start
    /// with `prefix`, and its value in the metric's unit: a count of nanoseconds (`…_ns`) is
    /// shown in seconds, Prometheus's base unit.
    pub fn metric(&self, prefix: &str) -> (String, f64) {
        match self.name.strip_suffix("_ns") {
            Some(stem) => (format!("{prefix}_{stem}_seconds_total"), self.value() as f64 / 1e9),
            None => (format!("{prefix}_{}_total", self.name), self.value() as f64),
        }
    }

    /// The doc comment on one line, as a Prometheus help text.
    pub fn help_line(&self) -> String {
        self.help.split_whitespace().collect::<Vec<_>>().join(" ")
    }
}

/// The counters as the fields of a JSON object, keyed by name.
pub fn json<'a>(counters: impl IntoIterator<Item = Counter<'a>>) -> serde_json::Map<String, serde_json::Value> {
    counters
        .into_iter()
        .map(|c| (c.name.to_string(), c.value().into()))
        .collect()
}

/// Renders the counters as the Prometheus counters `splitos_PREFIX_NAME_total`, described by
/// their help.
pub fn render<'a>(e: &mut crate::telemetry::Exposition, prefix: &str, counters: impl IntoIterator<Item = Counter<'a>>) {
    for c in counters {
        let (name, value) = c.metric(prefix);
        e.one(&name, crate::telemetry::Kind::Counter, &c.help_line(), value);
    }
}

/// Declares a struct of `AtomicU64` counters, each with a doc comment (its help text), and,
/// after `also`, the struct's other fields, each with its initial value. Gives the struct
/// `Default` (counters at zero) and `counters()`, every counter in declaration order, for
/// [`json`] and [`render`].
///
/// ```ignore
/// counters! {
///     /// What the counters count for.
///     pub struct Stats {
///         /// Requests answered.
///         requests,
///     }
///     also {
///         pub errors: Mutex<Vec<String>> = Mutex::default(),
///     }
/// }
/// ```
///
/// Exported (at the crate's root, with `use crate::counters;` bringing the module and the macro
/// together), so that the monitors keep declaring their counters with it once the crate is split.
#[macro_export]
macro_rules! counters {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
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
            pub fn counters(&self) -> impl Iterator<Item = $crate::counters::Counter<'_>> {
                [$(
                    $crate::counters::Counter {
                        name: stringify!($counter),
                        help: concat!($($doc, "\n"),+),
                        atomic: &self.$counter,
                    },
                )+]
                .into_iter()
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    counters! {
        /// Two counters and a field that is not one.
        struct Two {
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
        let all: Vec<Counter> = t.counters().collect();
        t.time_ns.store(1_500_000_000, Relaxed);
        assert_eq!(
            all.iter().map(|c| (c.name, c.value())).collect::<Vec<_>>(),
            [("things", 3), ("others", 0), ("time_ns", 1_500_000_000)]
        );
        assert_eq!(
            (all[0].help_line(), all[0].metric("x")),
            ("Things counted.".to_string(), ("x_things_total".to_string(), 3.0))
        );
        assert_eq!(all[2].metric("x"), ("x_time_seconds_total".to_string(), 1.5));
        assert_eq!(
            serde_json::Value::from(json(t.counters())),
            serde_json::json!({"things": 3, "others": 0, "time_ns": 1_500_000_000u64})
        );
    }
}
