//! Every metric series a component exports is declared once, with its name, kind, labels and
//! help (docs/control-plane.md, "Metrics"), in one of two tables:
//!
//! * [`series!`]: each crate's `series.rs` declares the series it records as things happen (through
//!   the `metrics` recorder) and the families it renders at a scrape ([`Exposition`]). A
//!   declaration is a typed static: a [`Counter`] cannot be set as a gauge, and a series with two
//!   labels is recorded with two values. Recording a series by a name of its own (the
//!   `metrics::counter!` family of macros) is refused by clippy (`clippy.toml`).
//! * [`counters!`]: a struct of counters a component keeps and also reports as JSON; one
//!   field per counter gives the JSON key and the series `splitos_<prefix>_<field>_total`.
//!
//! The whole catalogue (`splitos cluster metrics --declared`) is both tables of every crate; a
//! test fails on a series a component exports that is not in it.
use std::sync::OnceLock;

pub mod counters;
mod exposition;

pub use exposition::{escape, Exposition};

/// Every series' name starts with this.
pub const PREFIX: &str = "splitos";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

impl Kind {
    /// As the text format's `# TYPE` line names it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// A series as declared by [`series!`].
#[derive(Debug)]
pub struct Declaration {
    /// After `splitos_`.
    pub name: &'static str,
    pub kind: Kind,
    /// The declaration's doc comment, as written.
    pub help: &'static str,
    /// Its labels' names, beside the `component` and `role` every series carries.
    pub labels: &'static [&'static str],
}

/// One series of the catalogue: a [`Declaration`], or a counter of a [`counters!`] set, whose
/// name is its set's prefix and its field's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// After `splitos_`.
    pub name: String,
    pub kind: Kind,
    /// On one line.
    pub help: String,
    pub labels: Vec<&'static str>,
}

/// A doc comment on one line, as a Prometheus help text.
pub fn help_line(doc: &str) -> String {
    doc.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl Declaration {
    pub fn entry(&self) -> Entry {
        Entry {
            name: self.name.to_string(),
            kind: self.kind,
            help: help_line(self.help),
            labels: self.labels.to_vec(),
        }
    }

    fn key<V: Into<metrics::SharedString>, const N: usize>(&self, values: [V; N]) -> Vec<metrics::Label> {
        self.labels
            .iter()
            .zip(values)
            .map(|(k, v)| metrics::Label::new(*k, v))
            .collect()
    }
}

/// A counter with `N` labels.
pub struct Counter<const N: usize>(pub Declaration);

/// A gauge with `N` labels.
pub struct Gauge<const N: usize>(pub Declaration);

// The only place that names the recorder's series: by their declarations.
#[allow(clippy::disallowed_macros)]
impl<const N: usize> Counter<N> {
    /// The recorder's counter for these label values, in the declaration's order.
    pub fn with<V: Into<metrics::SharedString>>(&'static self, values: [V; N]) -> metrics::Counter {
        metrics::counter!(self.0.name, self.0.key(values))
    }
}

impl Counter<0> {
    /// The recorder's counter, to keep where it is counted often.
    pub fn handle(&'static self) -> metrics::Counter {
        self.with::<&'static str>([])
    }

    pub fn increment(&'static self, n: u64) {
        self.handle().increment(n)
    }
}

#[allow(clippy::disallowed_macros)]
impl<const N: usize> Gauge<N> {
    /// The recorder's gauge for these label values, in the declaration's order.
    pub fn with<V: Into<metrics::SharedString>>(&'static self, values: [V; N]) -> metrics::Gauge {
        metrics::gauge!(self.0.name, self.0.key(values))
    }
}

impl Gauge<0> {
    pub fn handle(&'static self) -> metrics::Gauge {
        self.with::<&'static str>([])
    }

    pub fn set(&'static self, v: f64) {
        self.handle().set(v)
    }

    pub fn increment(&'static self, v: f64) {
        self.handle().increment(v)
    }

    pub fn decrement(&'static self, v: f64) {
        self.handle().decrement(v)
    }
}

/// A declared series with `N` labels, as [`Exposition::family`] renders it.
pub trait Family<const N: usize> {
    fn declaration(&self) -> &Declaration;
}

impl<const N: usize> Family<N> for Counter<N> {
    fn declaration(&self) -> &Declaration {
        &self.0
    }
}

impl<const N: usize> Family<N> for Gauge<N> {
    fn declaration(&self) -> &Declaration {
        &self.0
    }
}

static CATALOGUE: OnceLock<Vec<Entry>> = OnceLock::new();

/// Keeps the process's whole catalogue (the program that holds every crate assembles it), so
/// that the recorder installed later describes each series with its help.
pub fn set_catalogue(entries: Vec<Entry>) {
    let _ = CATALOGUE.set(entries);
}

/// Describes every series of the catalogue to the installed recorder: its help is then
/// rendered with it.
#[allow(clippy::disallowed_macros)]
pub fn describe() {
    for e in CATALOGUE.get().into_iter().flatten() {
        match e.kind {
            Kind::Counter => metrics::describe_counter!(e.name.clone(), e.help.clone()),
            Kind::Gauge => metrics::describe_gauge!(e.name.clone(), e.help.clone()),
        }
    }
}

/// Declares series: each with its doc comment (its help), its kind (`Counter` or `Gauge`), its
/// labels' names if it has any, and its name after `splitos_`. Gives a static per series and
/// `declared()`, every one of them in declaration order.
///
/// ```ignore
/// splitos_metrics::series! {
///     /// Requests refused, by the status answered.
///     pub API_REFUSED: Counter["status"] = "gm_api_requests_refused_total";
///     /// Components registered now.
///     pub COMPONENTS: Gauge = "gm_components";
/// }
/// ```
#[macro_export]
macro_rules! series {
    ( $( $(#[doc = $doc:literal])+ $vis:vis $id:ident: $kind:ident $([$($label:literal),+])? = $name:literal; )+ ) => {
        $(
            $(#[doc = $doc])+
            $vis static $id: $crate::$kind<{ <[&str]>::len(&[$($($label),+)?]) }> = $crate::$kind($crate::Declaration {
                name: $name,
                kind: $crate::Kind::$kind,
                help: concat!($($doc, "\n"),+),
                labels: &[$($($label),+)?],
            });
        )+

        /// Every series declared here.
        pub fn declared() -> ::std::vec::Vec<$crate::Entry> {
            ::std::vec![$( $id.0.entry() ),+]
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    series! {
        /// Things
        /// counted.
        THINGS: Counter = "test_things_total";
        /// Doors, by colour and side.
        DOORS: Gauge["colour", "side"] = "test_doors";
    }

    #[test]
    fn a_declaration_gives_its_kind_labels_and_help_on_one_line() {
        assert_eq!(
            declared(),
            [
                Entry {
                    name: "test_things_total".into(),
                    kind: Kind::Counter,
                    help: "Things counted.".into(),
                    labels: vec![],
                },
                Entry {
                    name: "test_doors".into(),
                    kind: Kind::Gauge,
                    help: "Doors, by colour and side.".into(),
                    labels: vec!["colour", "side"],
                },
            ]
        );
        let mut e = Exposition::new(String::new());
        e.family(&DOORS, [(["red".to_string(), "left".to_string()], 2.0)]);
        e.one(&THINGS, 3.0);
        assert_eq!(
            e.text(),
            "# HELP splitos_test_doors Doors, by colour and side.\n# TYPE splitos_test_doors gauge\n\
             splitos_test_doors{colour=\"red\",side=\"left\"} 2\n\
             # HELP splitos_test_things_total Things counted.\n# TYPE splitos_test_things_total counter\n\
             splitos_test_things_total 3\n"
        );
    }
}
