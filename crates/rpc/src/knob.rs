//! Declaring a configuration knob once. A configuration is a struct that derives serde's traits
//! (its files and the JSON of the control plane) and clap's `Args` (its command line), each
//! field's doc comment its help and its `default_value_t` its one default: [`defaults`] builds
//! the `Default` that serde fills missing fields from out of those same attributes. A knob that
//! takes one of a few names is declared with [`knob_enum!`](crate::knob_enum).
use std::marker::PhantomData;
use std::str::FromStr;

use clap::builder::{PossibleValue, TypedValueParser};

/// Re-exported for [`knob_enum!`](crate::knob_enum), so that its users need not name them.
#[doc(hidden)]
pub use {clap as __clap, serde as __serde};

/// The value a command line without options gives `T`: every field's `default_value_t` (none
/// for an `Option`, empty for a `Vec`, the `skip` value for a field that is no option). An
/// option the command line requires (`required = true`) is left at what its type gives when
/// absent.
pub fn defaults<T: clap::Args + clap::FromArgMatches>() -> T {
    let cmd = T::augment_args(clap::Command::new("defaults").no_binary_name(true)).ignore_errors(true);
    let m = cmd
        .try_get_matches_from(std::iter::empty::<&str>())
        .expect("a command line without options parses");
    T::from_arg_matches(&m).expect("every option's default parses")
}

/// A configuration knob that takes one of a few lowercase names: the enum, the list of its names
/// (for errors), parsing with an error naming the knob and what it accepts, display and serde as
/// the name, and clap's parser, which lists the names in `--help`. A value has one name: a
/// second one (as `lru` was for CLOCK) reads as a policy the knob does not run.
#[macro_export]
macro_rules! knob_enum {
    ($(#[$meta:meta])* $vis:vis enum $name:ident, $knob:literal, $names:ident { $($(#[$vmeta:meta])* $var:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        $vis enum $name { $($(#[$vmeta])* $var),+ }

        $vis const $names: &[&str] = &[$($text),+];

        impl std::str::FromStr for $name {
            type Err = $crate::knob::UnknownName;
            fn from_str(s: &str) -> Result<$name, $crate::knob::UnknownName> {
                match s {
                    $($text => Ok($name::$var),)+
                    _ => Err($crate::knob::UnknownName {
                        knob: $knob,
                        name: s.to_string(),
                        known: $names,
                    }),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(match self { $($name::$var => $text),+ })
            }
        }

        impl $crate::knob::__serde::Serialize for $name {
            fn serialize<S: $crate::knob::__serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> $crate::knob::__serde::Deserialize<'de> for $name {
            fn deserialize<D: $crate::knob::__serde::Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                let s = <String as $crate::knob::__serde::Deserialize>::deserialize(d)?;
                s.parse().map_err(<D::Error as $crate::knob::__serde::de::Error>::custom)
            }
        }

        impl $crate::knob::__clap::builder::ValueParserFactory for $name {
            type Parser = $crate::knob::KnobParser<$name>;
            fn value_parser() -> Self::Parser {
                $crate::knob::KnobParser::new($names)
            }
        }
    };
}

/// A name that a [`knob_enum!`](crate::knob_enum) knob does not take.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {knob} {name:?} (known: {})", known.join(", "))]
pub struct UnknownName {
    pub knob: &'static str,
    pub name: String,
    pub known: &'static [&'static str],
}

/// Clap's parser of a [`knob_enum!`](crate::knob_enum): its own parsing, and its names for `--help`.
pub struct KnobParser<T> {
    names: &'static [&'static str],
    knob: PhantomData<fn() -> T>,
}

impl<T> KnobParser<T> {
    pub fn new(names: &'static [&'static str]) -> KnobParser<T> {
        KnobParser {
            names,
            knob: PhantomData,
        }
    }
}

impl<T> Clone for KnobParser<T> {
    fn clone(&self) -> Self {
        KnobParser::new(self.names)
    }
}

impl<T: FromStr<Err = UnknownName> + Clone + Send + Sync + 'static> TypedValueParser for KnobParser<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<T, clap::Error> {
        (|s: &str| s.parse::<T>()).parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(self.names.iter().map(PossibleValue::new)))
    }
}
